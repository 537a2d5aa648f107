"""What the real-client tests share besides the clients: the simulated engine, the handout
an agent is configured from, and the routing log."""

from __future__ import annotations

from typing import Any

import httpx
from harness import RunningNode, wait_until

from hubpool_sim import SimConfig, SimModel

#: the model the simulated engines hold; its window fits an agent's first turn with room
MODEL = "coder:30b"
WINDOW = 65536
#: the handout an agent is configured from (what `hubpool handout --agent` asks for)
HANDOUT = "/api/inference/pool/handout?tools=true&minContext=32768"
ROUTING_LOG = "/api/inference/pool/routing-log?limit=500"


def sim_config(*, agent_routes: bool, **extra: Any) -> SimConfig:
    """A llama-server simulator holding MODEL: serving Messages and Responses itself
    (``agent_routes``), or chat completions only (the node translates), scripted never to call
    a tool unless a test says otherwise."""
    extra.setdefault("tool_script", [])
    return SimConfig(flavor="llamacpp", models=[SimModel(MODEL, window=WINDOW)], agent_routes=agent_routes, **extra)


def handout(node: RunningNode) -> dict[str, Any]:
    """The node's handout as an agent asks for it (tools, a 32k floor)."""
    r = httpx.get(node.url + HANDOUT, timeout=30, trust_env=False)
    assert r.status_code == 200, r.text
    return r.json()


def aliases(node: RunningNode) -> list[str]:
    """The pool's model aliases as /v1/models lists them (what `hubpool handout --agent` reads)."""
    r = httpx.get(node.url + "/v1/models", timeout=30, trust_env=False)
    assert r.status_code == 200, r.text
    return [m["id"] for m in r.json()["data"] if m.get("owned_by") == "hub-pool-alias"]


def routing_rows(node: RunningNode) -> list[dict[str, Any]]:
    with node.client(headers=node.headers()) as c:
        return c.get(ROUTING_LOG).json()["entries"]


def settled_rows(node: RunningNode, seen: set[str], timeout: float = 15.0) -> list[dict[str, Any]]:
    """The routing-log rows not in ``seen``, once none is still pending: a client may exit on
    the last event it needs a moment before the node has settled the row of that stream."""
    rows: list[dict[str, Any]] = []

    def settled() -> bool:
        nonlocal rows
        rows = [r for r in routing_rows(node) if r["id"] not in seen]
        return bool(rows) and all(r["outcome"] != "pending" for r in rows)

    wait_until(settled, timeout=timeout, interval=0.1)
    return rows


def summary(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What an assertion message shows of routing-log rows."""
    return [(r["path"], r["outcome"], r["status"], r["node"], r["reason"], r["bodyBytes"]) for r in rows]
