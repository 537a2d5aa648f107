"""Capture one real request of each agent client and scrub it into tests/real_clients/data/.

    uv run python tests/real_clients/capture.py [--agent claude-code|codex|opencode]... [--raw DIR]

Each client (installed, pinned, by scripts/install_agent_clients.py) runs one turn,
configured from its handout exactly as the tests run it, against a recorder on loopback that
keeps every request byte for byte and has a simulated llama-server answer it. The request
kept is the client's turn: the largest one that offers tools (OpenCode sends a title request
first). scrub_capture.py then removes the keys, ids and prose; the raw captures stay only in
``--raw`` (a temporary folder by default) and are never committed. Rerun it when a pinned
version moves, and commit the new fixtures with the version bump.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiohttp_thread import ThreadedApp  # noqa: E402 - after the path the tests use
from real_clients.agents import AGENTS, COMMAND, AgentRun, installer  # noqa: E402
from real_clients.scrub_capture import scrub  # noqa: E402
from real_clients.support import MODEL, sim_config  # noqa: E402
from real_clients.tap import tap  # noqa: E402

from hubpool_sim import run_in_thread  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
PROMPT = "Say hello in five words."
PACKAGE = {"claude-code": "@anthropic-ai/claude-code", "codex": "@openai/codex", "opencode": "opencode-ai"}


def the_turn(requests: list[dict[str, Any]]) -> dict[str, Any]:
    """The client's turn among what it sent: the largest request that offers tools."""
    def tools(r: dict[str, Any]) -> bool:
        try:
            return bool(json.loads(r["body"]).get("tools"))
        except ValueError:
            return False

    turns = [r for r in requests if r["method"] == "POST" and tools(r)]
    if not turns:
        raise SystemExit(f"no request with tools among {[r['path'] for r in requests]}")
    return max(turns, key=lambda r: len(r["body"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", action="append", choices=AGENTS, help="only this client (repeatable)")
    parser.add_argument("--raw", type=Path, help="keep the raw captures here (never commit them)")
    args = parser.parse_args(argv)
    module = installer()
    if module.missing():
        print(f"the clients are not installed as pinned: {module.missing()}; run "
              "`uv run python scripts/install_agent_clients.py`")
        return 1
    bins = module.binaries()
    raw_dir = args.raw or Path(tempfile.mkdtemp(prefix="hubpool-capture-"))
    raw_dir.mkdir(parents=True, exist_ok=True)
    with run_in_thread(sim_config(agent_routes=True)) as sim:
        for agent in args.agent or AGENTS:
            kept: list[dict[str, Any]] = []
            with ThreadedApp(tap(sim.url, kept)) as rec, tempfile.TemporaryDirectory() as tmp:
                # no window in the handout: the clients' own defaults (max_tokens 32000 and all)
                handout = {"anthropicBaseUrl": rec.url, "model": MODEL, "numCtx": None, "warnings": [],
                           "servedBy": []}
                turn = AgentRun(agent, bins[COMMAND[agent]], Path(tmp), handout).run(PROMPT)
            if not turn.succeeded:
                print(turn.describe())
                return 1
            raw = the_turn(kept)
            (raw_dir / f"{agent}.json").write_text(json.dumps(raw, indent=1))
            version = module.PINNED[PACKAGE[agent]][0]
            fixture = scrub(raw, agent=agent, version=version, keep=(PROMPT,))
            fixture["captured"] = datetime.date.today().isoformat()
            (DATA / f"{agent}.json").write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
            print(f"{agent} {version}: {raw['method']} {raw['path']}, {len(raw['body'])} bytes "
                  f"-> {DATA / f'{agent}.json'} (raw: {raw_dir / f'{agent}.json'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
