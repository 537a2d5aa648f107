"""The `hubpool` entry point.

`hubpool serve` is the long-running process and the one whose memory counts (docs/performance.md,
G7): typer and rich (about 12 MB resident) are not imported for it. Its two options are read
here; anything else, and every other command, goes to the typer CLI in
hubpool_core.cli.commands, which also answers `serve --help` and misspelt options. On POSIX the
serve process re-executes itself under `python -OO` first: the docstrings of everything a node
imports (SQLAlchemy's, pydantic's, aiohttp's ...) are about 4.5 MB resident that nothing in a
serving node reads (hubpool's own code uses no assert for anything but type narrowing).
"""

from __future__ import annotations

import os
import sys
from typing import Any

SERVE_OPTIONS = ("--listen", "--log-level")


def serve_arguments(argv: list[str]) -> dict[str, str] | None:
    """{"--listen": ..., "--log-level": ...} when ``argv`` is exactly `serve` with those options
    (`--opt value` or `--opt=value`, each at most once); None for anything else."""
    if not argv or argv[0] != "serve":
        return None
    found: dict[str, str] = {}
    rest = argv[1:]
    i = 0
    while i < len(rest):
        arg = rest[i]
        name, eq, value = arg.partition("=")
        if name not in SERVE_OPTIONS or name in found:
            return None
        if not eq:
            if i + 1 >= len(rest) or rest[i + 1].startswith("-"):
                return None
            value = rest[i + 1]
            i += 1
        found[name] = value
        i += 1
    return found


def main() -> None:
    """Run the `hubpool` command line."""
    for stream in (sys.stdout, sys.stderr):  # a terminal that cannot show ✓ gets '?', never a traceback
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    if sys.argv[1:] in (["--version"], ["-V"]):
        # answered before typer and the plugins load: it must work even when one is broken
        from hubpool_core.cli.version import version_text

        print(version_text())
        return
    options = serve_arguments(sys.argv[1:])
    if options is None:
        from hubpool_core.cli.commands import main as cli_main

        cli_main()
        return
    _without_docstrings()
    from hubpool_core.config import EnvSettings
    from hubpool_core.node.server import run_node

    if options.get("--listen"):
        os.environ["HUB_POOL_LISTEN"] = options["--listen"]
    from hubpool_core.store.db import DatabaseUrlError, SchemaTooNew

    try:
        run_node(EnvSettings(), log_level=options.get("--log-level", "info"))
    except (SchemaTooNew, DatabaseUrlError) as exc:  # a downgrade, a mistyped URL: a sentence, not a traceback
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


def _without_docstrings() -> None:
    """Replace this process with `python -OO -P -m hubpool_core.cli <the same arguments>` (same pid,
    same environment), unless it already runs so or cannot (no interpreter path, not POSIX)."""
    if sys.flags.optimize >= 2 or os.name != "posix" or not sys.executable:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    # -P: `-m` would otherwise put the working directory first on sys.path, where a directory
    # that happens to be named hubpool_core would shadow the installed package
    os.execv(sys.executable, [sys.executable, "-OO", "-P", "-m", "hubpool_core.cli", *sys.argv[1:]])


def __getattr__(name: str) -> Any:
    # `from hubpool_core.cli.main import app` (and the other names) keeps working; dunder
    # lookups (the import system asks for __path__) must not load the typer CLI
    if name.startswith("__"):
        raise AttributeError(name)
    from hubpool_core.cli import commands

    return getattr(commands, name)
