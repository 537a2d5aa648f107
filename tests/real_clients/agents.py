"""The three real agent clients, driven non-interactively against a node: Claude Code
(``claude -p``), Codex CLI (``codex exec``) and OpenCode (``opencode run``).

Each run gets a fresh home folder and work folder, and is configured with exactly what
``hubpool handout --agent`` prints for it (the same function builds it), plus what keeps a
test run off the network: telemetry, update checks, catalogue fetches and plugin installs
off, so the only address a client dials is the node's, on loopback (``outside_dials`` checks
that under strace). The environment is built from nothing: a developer's own keys and
proxies never reach a client.

The binaries come from ``scripts/install_agent_clients.py`` (pinned versions, in
``~/.cache/hubpool/agent-clients`` or ``HUBPOOL_AGENT_CLIENTS``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hubpool_core.placement.handout import agent_setup

REPO = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO / "scripts" / "install_agent_clients.py"
AGENTS = ("claude-code", "codex", "opencode")
COMMAND = {"claude-code": "claude", "codex": "codex", "opencode": "opencode"}

#: what each client needs beyond its handout to stay on loopback in a test (see module docstring)
QUIET = {
    "claude-code": {"DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1"},
    "codex": {},
    # OpenCode installs its plugin package into its config folder from the npm registry at every
    # start (in the background; a failure is only logged): offline, npm answers from its empty cache
    "opencode": {"OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
                 "npm_config_offline": "true"},
}


def installer() -> Any:
    """scripts/install_agent_clients.py as a module (the pinned versions, where they live)."""
    spec = importlib.util.spec_from_file_location("install_agent_clients", INSTALL_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def install_hint() -> str:
    """The exact commands that install the pinned clients, for a skip message."""
    module = installer()
    return (f"install them once with `uv run python scripts/install_agent_clients.py` (it runs "
            f"`{' '.join(module.npm_command())}`, ~1.1 GB, ~35 s)")


def argv(agent: str, binary: Path, prompt: str) -> list[str]:
    """One non-interactive turn, every event printed as a JSON line."""
    if agent == "claude-code":
        return [str(binary), "-p", prompt, "--output-format", "stream-json", "--verbose"]
    if agent == "codex":
        return [str(binary), "exec", "--skip-git-repo-check", "--json", prompt]
    return [str(binary), "run", "--format", "json", prompt]


@dataclass
class Turn:
    """One finished run of a client: its exit code, output and the JSON events it printed."""

    agent: str
    returncode: int
    stdout: str
    stderr: str
    trace: Path | None = None
    events: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for line in self.stdout.splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    self.events.append(json.loads(line))
                except ValueError:
                    continue

    def describe(self) -> str:
        """For an assertion message: the exit code and both streams' tails."""
        return (f"{self.agent} exited {self.returncode}\n--- stdout (tail)\n{self.stdout[-3000:]}\n"
                f"--- stderr (tail)\n{self.stderr[-3000:]}")

    @property
    def succeeded(self) -> bool:
        """Exit 0, and the client itself says the turn ended well (Claude Code exits 0 even
        when its result is an error)."""
        if self.returncode != 0:
            return False
        if self.agent == "claude-code":
            results = [e for e in self.events if e.get("type") == "result"]
            return bool(results) and results[-1].get("is_error") is False
        if self.agent == "codex":
            return any(e.get("type") == "turn.completed" for e in self.events) and \
                not any(e.get("type") in ("turn.failed", "error") for e in self.events)
        return not any(e.get("type") == "error" for e in self.events)

    def tool_outputs(self) -> list[str]:
        """What each tool the client ran gave back, as the client reports it."""
        out: list[str] = []
        for e in self.events:
            if self.agent == "claude-code" and e.get("type") == "user":
                for block in (e.get("message") or {}).get("content") or []:
                    if isinstance(block, dict) and block.get("type") == "tool_result":
                        out.append(_text(block.get("content")))
            elif self.agent == "codex" and e.get("type") == "item.completed":
                item = e.get("item") or {}
                if item.get("type") == "command_execution":
                    out.append(str(item.get("aggregated_output") or ""))
            elif self.agent == "opencode" and e.get("type") == "tool_use":
                state = (e.get("part") or {}).get("state") or {}
                out.append(str(state.get("output") or ""))
        return out


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return ""


class AgentRun:
    """A client set up in ``root`` (its own home, and a work folder unless ``work`` names a
    shared one) against one node's handout and model aliases."""

    def __init__(self, agent: str, binary: Path, root: Path, handout: dict[str, Any],
                 extra_env: dict[str, str] | None = None, work: Path | None = None,
                 aliases: tuple[str, ...] | list[str] = ()) -> None:
        self.agent, self.binary = agent, binary
        self.home, self.work = root / "home", work or root / "work"
        self.home.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        self.setup = agent_setup(agent, handout, aliases)
        for file in self.setup["files"]:
            path = self.home / file["path"].removeprefix("~/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(file["content"])
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home), "LANG": "C.UTF-8",
                    "TERM": "dumb", "NO_COLOR": "1", **self.setup["env"], **QUIET[agent], **(extra_env or {})}

    def run(self, prompt: str, *, timeout: float = 240, trace: Path | None = None) -> Turn:
        """One turn; ``trace`` runs it under ``strace -f -e trace=connect`` into that file."""
        command = argv(self.agent, self.binary, prompt)
        if trace is not None:
            command = ["strace", "-f", "-qq", "-e", "trace=connect", "-o", str(trace), *command]
        try:
            proc = subprocess.run(command, cwd=self.work, env=self.env, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=timeout, start_new_session=True)
        except subprocess.TimeoutExpired as exc:
            return Turn(self.agent, -1, _decoded(exc.stdout), _decoded(exc.stderr) + f"\n(timed out after {timeout} s)",
                        trace)
        return Turn(self.agent, proc.returncode, proc.stdout, proc.stderr, trace)


def _decoded(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else (value or "")


_DIAL = re.compile(r'connect\(\d+, \{sa_family=AF_INET6?, sin6?_port=htons\((\d+)\), '
                   r'(?:sin_addr=inet_addr\("([^"]+)"\)|sin6_flowinfo=[^,]*, inet_pton\(AF_INET6, "([^"]+)")')
_LOOPBACK = ("127.", "::1", "::ffff:127.")


def outside_dials(trace: Path) -> list[str]:
    """Every address:port a traced run dialled that is not loopback (a DNS server included:
    a name looked up is a name about to be dialled)."""
    found = []
    for match in _DIAL.finditer(trace.read_text(errors="replace")):
        port, v4, v6 = match.groups()
        address = v4 or v6
        if not address.startswith(_LOOPBACK):
            found.append(f"{address}:{port}")
    return found
