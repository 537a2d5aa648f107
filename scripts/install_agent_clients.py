"""Install the three agent clients the real-client tests drive, pinned, once, into a cache folder.

Claude Code, Codex CLI and OpenCode all publish to the npm registry (one of the registries this
project's machines and CI reach); each ships its own native binary in a per-platform package,
so only ``npm`` is needed, not a particular Node.js. They land in
``~/.cache/hubpool/agent-clients`` (``HUBPOOL_AGENT_CLIENTS`` overrides it), binaries in its
``node_modules/.bin``; a second run finds them at the pinned versions and only prints the path.

Usage: ``uv run python scripts/install_agent_clients.py [--force]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

#: npm package -> (pinned version, the command it puts in node_modules/.bin); bump with care:
#: tests/real_clients/ drives these exact versions and their captured requests are fixtures
PINNED = {
    "@anthropic-ai/claude-code": ("2.1.328", "claude"),
    "@openai/codex": ("0.169.0", "codex"),
    "opencode-ai": ("1.18.33", "opencode"),
}
ENV = "HUBPOOL_AGENT_CLIENTS"


class InstallError(RuntimeError):
    """A step failed; the message says which and what to do."""


def cache_root() -> Path:
    """Where the clients are installed (a folder holding node_modules/)."""
    env = os.environ.get(ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hubpool" / "agent-clients"


def npm_command(root: Path | None = None) -> list[str]:
    """The exact npm command this script runs (the tests print it when the clients are absent)."""
    specs = [f"{name}@{version}" for name, (version, _) in PINNED.items()]
    return ["npm", "install", "--prefix", str(root or cache_root()), "--no-audit", "--no-fund", "--no-save",
            *specs]


def installed_versions(root: Path | None = None) -> dict[str, str | None]:
    """npm package -> the version installed under ``root`` (None when absent or unreadable)."""
    found: dict[str, str | None] = {}
    for name in PINNED:
        manifest = (root or cache_root()) / "node_modules" / name / "package.json"
        try:
            found[name] = json.loads(manifest.read_text()).get("version")
        except (OSError, ValueError):
            found[name] = None
    return found


def binaries(root: Path | None = None) -> dict[str, Path]:
    """Command name -> where its binary is (whether or not it exists yet)."""
    bin_dir = (root or cache_root()) / "node_modules" / ".bin"
    return {command: bin_dir / command for _, command in PINNED.values()}


def missing(root: Path | None = None) -> list[str]:
    """What keeps the clients from being usable as pinned: absent or other versions."""
    have = installed_versions(root)
    problems = [f"{name} {have[name] or 'absent'} (pinned {version})"
                for name, (version, _) in PINNED.items() if have[name] != version]
    problems += [f"{path} missing" for path in binaries(root).values() if not path.exists()]
    return problems


def say(msg: str) -> None:
    print(f"[install_agent_clients] {msg}", flush=True)


def install(force: bool = False) -> Path:
    """Install the pinned clients unless they are already there; returns the bin folder."""
    root = cache_root()
    if not force and not missing(root):
        say(f"already installed: {root / 'node_modules' / '.bin'}")
        return root / "node_modules" / ".bin"
    if shutil.which("npm") is None:
        raise InstallError("'npm' is not on PATH; install Node.js and npm (apt-get install nodejs npm)")
    root.mkdir(parents=True, exist_ok=True)
    command = npm_command(root)
    say("$ " + " ".join(command))
    started = time.monotonic()
    # npm's own update nag and funding notes are outside traffic nobody asked for
    env = {**os.environ, "npm_config_update_notifier": "false", "npm_config_fund": "false"}
    proc = subprocess.run(command, cwd=root, env=env)
    if proc.returncode != 0:
        raise InstallError(f"npm install failed with exit code {proc.returncode}: {' '.join(command)}")
    still = missing(root)
    if still:
        raise InstallError("npm finished but the clients are not as pinned: " + "; ".join(still))
    say(f"installed in {time.monotonic() - started:.0f} s: {root / 'node_modules' / '.bin'}")
    return root / "node_modules" / ".bin"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="reinstall even when the pinned versions are there")
    args = parser.parse_args(argv)
    try:
        install(force=args.force)
    except InstallError as exc:
        say(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
