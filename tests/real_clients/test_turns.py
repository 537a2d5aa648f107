"""Each real agent client, unmodified, finishes a turn through a node with exit 0: against an
engine that serves the agent dialects itself (natively) and one that serves only chat
completions (translated), configured from nothing but its handout, and dialling nothing but
the node (strace watches every connect it makes)."""

from __future__ import annotations

import pytest
from real_clients.agents import AGENTS, outside_dials
from real_clients.support import MODEL, routing_rows, settled_rows, summary

pytestmark = [pytest.mark.real_clients, pytest.mark.timeout(300)]

#: the route each client's turn takes, and what the engine is asked when it serves only chat
CHAT = "/v1/chat/completions"
ROUTE = {"claude-code": "/v1/messages", "codex": "/v1/responses", "opencode": CHAT}


@pytest.mark.parametrize("mode", ["native", "translated"])
@pytest.mark.parametrize("agent", AGENTS)
def test_one_turn_through_a_node_exits_0_and_dials_only_the_node(agent, mode, engines, agent_run, strace, tmp_path):
    node, sim = engines[mode]
    seen = {r["id"] for r in routing_rows(node)}
    before = sim.stats()
    client = agent_run(agent, node)
    assert client.setup["model"] == MODEL  # the handout named the pool's model
    trace = tmp_path / "connects.txt" if strace else None
    turn = client.run("Say hello in five words.", trace=trace)
    assert turn.succeeded, turn.describe()
    if trace is not None:
        assert outside_dials(trace) == [], f"{agent} dialled beyond loopback: {outside_dials(trace)}"
    rows = settled_rows(node, seen)
    assert rows and all(r["outcome"] == "served" and r["status"] == 200 and r["model"] == MODEL for r in rows), \
        summary(rows)
    assert {r["path"] for r in rows} == {ROUTE[agent]}, summary(rows)
    # what the engine was asked: the client's own route when it serves it, else chat completions
    # (the node's route probes name no model, and count on their paths but not on the model)
    after = sim.stats()
    assert after["by_model"][MODEL] - before["by_model"].get(MODEL, 0) == len(rows)
    chat = after["by_path"].get(CHAT, 0) - before["by_path"].get(CHAT, 0)
    assert chat == (len(rows) if mode == "translated" or agent == "opencode" else 0), after["by_path"]
