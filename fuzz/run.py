"""Run one fuzz target under atheris for a bounded time, or replay its corpus.

    uv run python -m fuzz <target> --seconds 60      # libFuzzer, seeded from fuzz/corpus/<target>/
    uv run python -m fuzz <target> --seconds 0       # replay the committed corpus only
    uv run python -m fuzz all --seconds 60           # every target in turn

New inputs libFuzzer finds go to a scratch directory (``--keep DIR`` to keep them), never into
the committed corpus; a crash is written to ``fuzz/artifacts/`` and the exit status is non-zero.
Add a crashing input to ``fuzz/corpus/<target>/`` once the product is fixed, so CI replays it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
ARTIFACTS = HERE / "artifacts"


def replay(name: str) -> int:
    """Run ``name`` over every file of its committed corpus; returns how many ran."""
    from fuzz.targets import TARGETS

    target = TARGETS[name]
    files = sorted((CORPUS / name).iterdir())
    for path in files:
        target(path.read_bytes())
    return len(files)


def _fuzz_child(name: str, seconds: int, scratch: str) -> None:
    import atheris

    with atheris.instrument_imports(include=["hubpool_core", "fuzz"]):
        import hubpool_core.access.guards  # noqa: F401
        import hubpool_core.access.sessions  # noqa: F401
        import hubpool_core.api.edge  # noqa: F401
        import hubpool_core.api.local  # noqa: F401
        import hubpool_core.api.peers  # noqa: F401
        import hubpool_core.engine  # noqa: F401
        import hubpool_core.peering.addresses  # noqa: F401 - imported under instrumentation
        import hubpool_core.peering.guard  # noqa: F401
        import hubpool_core.peering.signing  # noqa: F401
        import hubpool_core.proxy.output_check  # noqa: F401
        import hubpool_core.proxy.translate  # noqa: F401
        import hubpool_core.telemetry.routing_log  # noqa: F401
        import hubpool_core.web.routes  # noqa: F401
        from fuzz.targets import TARGETS
    ARTIFACTS.mkdir(exist_ok=True)
    argv = [sys.argv[0], scratch, str(CORPUS / name), f"-max_total_time={seconds}",
            f"-artifact_prefix={ARTIFACTS}/{name}-", "-max_len=4096", "-rss_limit_mb=2048", "-timeout=10"]
    atheris.Setup(argv, TARGETS[name])
    atheris.Fuzz()


#: the targets in fuzz/targets.py, named here so the child can instrument before importing them
NAMES = ("frames", "output_check", "fqdn", "address", "signature_headers", "edge_body",
         "refusal_headers", "signin_sources")


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", choices=[*NAMES, "all"])
    parser.add_argument("--seconds", type=int, default=60, help="time box per target; 0 replays the corpus only")
    parser.add_argument("--keep", help="directory for new inputs (default: a temporary one)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = list(NAMES) if args.target == "all" else [args.target]
    if args.child:
        _fuzz_child(names[0], args.seconds, args.keep)
        return 0
    status = 0
    for name in names:
        print(f"{name}: corpus of {replay(name)} inputs replayed", flush=True)
        if args.seconds <= 0:
            continue
        with tempfile.TemporaryDirectory(prefix=f"fuzz-{name}-") as scratch:
            out = args.keep or scratch
            Path(out).mkdir(parents=True, exist_ok=True)
            # a child process: libFuzzer exits the process when it stops
            code = subprocess.call([sys.executable, "-m", "fuzz", name, "--seconds", str(args.seconds),
                                    "--keep", out, "--child"], cwd=HERE.parent)
        print(f"{name}: {'clean' if code == 0 else f'FAILED (exit {code}); see {ARTIFACTS}'}", flush=True)
        status = status or code
    return status
