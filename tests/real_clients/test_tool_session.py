"""A multi-turn session per real client: the simulated model asks for a file in the client's
work folder to be read, the client runs its own tool and sends the result back, and the model
finishes the turn. Natively (the engine serves the client's dialect) and translated (the node
turns the call and its result into chat completions and back)."""

from __future__ import annotations

import secrets

import pytest
from real_clients.agents import AGENTS
from real_clients.support import MODEL, routing_rows, settled_rows, summary

pytestmark = [pytest.mark.real_clients, pytest.mark.timeout(300)]

PROMPT = "Read the file notes.txt in this folder and tell me what it says."


def read_step(work) -> dict:
    """Each client's name for "read this file", with its arguments: one script step serves all."""
    notes = str(work / "notes.txt")
    return {"Read": {"file_path": notes},  # Claude Code
            "exec_command": {"cmd": "cat notes.txt"},  # Codex
            "read": {"filePath": notes}}  # OpenCode


@pytest.mark.parametrize("mode", ["native", "translated"])
@pytest.mark.parametrize("agent", AGENTS)
def test_the_model_asks_for_a_file_and_the_client_reads_it_and_finishes(agent, mode, engines, agent_run):
    node, sim = engines[mode]
    client = agent_run(agent, node)
    secret = f"hubpool-notes-{secrets.token_hex(6)}"
    (client.work / "notes.txt").write_text(secret + "\n")
    seen = {r["id"] for r in routing_rows(node)}
    sim.configure(tool_script=[read_step(client.work)])
    try:
        turn = client.run(PROMPT)
    finally:
        sim.configure(tool_script=[])
    assert turn.succeeded, turn.describe()
    # the client ran its own tool on the file the model named, and reported what it read
    assert any(secret in output for output in turn.tool_outputs()), turn.describe()
    rows = settled_rows(node, seen)
    assert all(r["outcome"] == "served" and r["model"] == MODEL for r in rows), summary(rows)
    # the turn that asked for the call, then the one that carried its result back (OpenCode adds a title)
    assert len([r for r in rows if r["path"] != "/v1/chat/completions" or agent == "opencode"]) >= 2, summary(rows)
