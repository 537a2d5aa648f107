"""Fixtures for the real-client tests: the installed clients, simulated engines behind real
nodes, and the handout each client is configured from.

Without the clients these tests skip, saying how to install them — except under CI
(``CI=true``), where .ci/run installs them first, so their absence is a failure.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import RunningNode
from real_clients.agents import AGENTS, COMMAND, AgentRun, install_hint, installer
from real_clients.support import aliases, handout, sim_config

from hubpool_sim import run_in_thread


def _unavailable(message: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(message + " -- under CI=true .ci/run must install them before pytest", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def agent_binaries() -> dict[str, Path]:
    """Each agent's binary at its pinned version, or a skip (a failure under CI) saying how."""
    module = installer()
    problems = module.missing()
    if problems:
        _unavailable(f"the agent clients are not installed as pinned ({'; '.join(problems)}); {install_hint()}")
    bins = module.binaries()
    return {agent: bins[COMMAND[agent]] for agent in AGENTS}


@pytest.fixture(scope="session")
def strace() -> str | None:
    """strace, to watch what a client dials (under CI it must be there: .ci/run installs it)."""
    found = shutil.which("strace")
    if found is None and os.environ.get("CI") == "true":
        pytest.fail("strace is not installed -- .ci/run installs it (apt-get install strace)", pytrace=False)
    return found


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[RunningNode, Any]]]:
    """Two nodes, each with one simulated engine: "native" serves the agent dialects itself,
    "translated" only chat completions. Module scope: the clients' runs are what costs."""
    root = tmp_path_factory.mktemp("engines")
    with run_in_thread(sim_config(agent_routes=True)) as native, \
            run_in_thread(sim_config(agent_routes=False)) as chat_only, \
            RunningNode(root / "native", {"LLAMACPP_URL": native.url}) as n1, \
            RunningNode(root / "translated", {"LLAMACPP_URL": chat_only.url}) as n2:
        yield {"native": (n1, native), "translated": (n2, chat_only)}


@pytest.fixture
def agent_run(agent_binaries: dict[str, Path], tmp_path: Path) -> Callable[..., AgentRun]:
    """A factory: ``agent_run("codex", node)`` sets the client up in its own home and work
    folder from ``node``'s handout and aliases, as `hubpool handout --agent` does."""
    count = 0

    def make(agent: str, node: RunningNode, **kwargs: Any) -> AgentRun:
        nonlocal count
        count += 1
        return AgentRun(agent, agent_binaries[agent], tmp_path / f"{agent}-{count}", handout(node),
                        aliases=aliases(node), **kwargs)

    return make
