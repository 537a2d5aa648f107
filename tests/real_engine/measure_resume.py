"""How often a resumed answer equals the uninterrupted one on real llama-servers (issue 28
item 4; the figure in docs/reliability.md, "Resume").

    uv run python tests/real_engine/measure_resume.py            # 12 runs per model, ~3 min
    uv run python tests/real_engine/measure_resume.py --runs 24 --json /tmp/resume.json

For each model of tests/real_engine/resume_rig.py, two nodes beside two llama-servers
(greedy: temperature 0, a fixed seed), resume on: each run streams one answer from hub-a,
SIGSTOPs or SIGKILLs hub-a's llama-server once the app has read a little of it (the dialect,
the question and stall or kill turn in order), and compares the answer the app got with the
same request uninterrupted. It reports how many were resumed, how many equal byte for byte,
how many kept the text before the cut, and where the others first differ.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]  # tests/: the harness and this package

from real_engine import resume_rig  # noqa: E402
from real_engine.support import find_llama_server  # noqa: E402

QUESTIONS = ("Why is the sky blue?", "What is a pool?", "Tell me a story.")
DIALECTS = ("openai", "native", "messages", "responses")


def measure(kind: str, runs: int, tokens: int, root: Path, binary: Path) -> dict:
    model = resume_rig.write_model(root / f"{kind}.gguf", kind)
    (root / kind).mkdir()
    pool = resume_rig.start_pool(root / kind, binary, model)
    rows = []
    try:
        plan = itertools.product(("stall", "kill"), DIALECTS, QUESTIONS)
        for how, dialect, question in itertools.islice(itertools.cycle(plan), runs):
            run = resume_rig.resumed_run(pool, dialect, tokens, after_chars=20, how=how, question=question)
            cut = run.cut_at
            differ = next((i for i, (x, y) in enumerate(zip(run.whole, run.resumed, strict=False)) if x != y),
                          min(len(run.whole), len(run.resumed)))
            rows.append({"dialect": dialect, "how": how, "resumed": cut is not None, "equal": run.equal,
                         "keptPrefix": cut is not None and run.resumed[:cut] == run.whole[:cut],
                         "cutAt": cut, "firstDifferenceAfterCut": None if run.equal or cut is None else differ - cut,
                         "lengthDifference": len(run.resumed) - len(run.whole), "outcome": run.row["outcome"]})
            print(f"{kind:8} {dialect:9} {how:5} cut at {cut}: {'equal' if run.equal else 'differs'}", flush=True)
    finally:
        pool.close()
    resumed = [r for r in rows if r["resumed"]]
    return {"model": kind, "runs": len(rows), "resumed": len(resumed), "equal": sum(r["equal"] for r in resumed),
            "keptPrefix": sum(r["keptPrefix"] for r in resumed), "served": sum(r["outcome"] == "served" for r in rows),
            "rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=12, help="runs per model (default 12)")
    parser.add_argument("--tokens", type=int, default=1000, help="the answer's length in tokens (default 1000)")
    parser.add_argument("--models", default=",".join(resume_rig.MODELS), help="which of " + ",".join(resume_rig.MODELS))
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    binary, where = find_llama_server()
    if binary is None:
        print(f"llama-server not found at {where}; build it with `uv run python scripts/build_llama_server.py`")
        return 2
    with tempfile.TemporaryDirectory(prefix="hubpool-resume-") as tmp:
        results = [measure(kind, args.runs, args.tokens, Path(tmp), binary) for kind in args.models.split(",")]
    for r in results:
        print(f"{r['model']}: {r['equal']} of {r['resumed']} resumed answers equal the uninterrupted one "
              f"({r['keptPrefix']} kept the text before the cut; {r['served']} of {r['runs']} served)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
