"""The history checker catches what it claims to: each kind of disagreement between a client
history and the routing logs, planted one at a time into an otherwise consistent run, is
reported (so a clean reconciliation in F1-F7 means something)."""

from __future__ import annotations

import copy

import pytest
from history import FAIL, INDETERMINATE, OK, History, Op, reconcile

FQDNS = {"hub-a": "hub-a.t.ts.net", "hub-b": "hub-b.t.ts.net"}


def _row(rid: str, direction: str, node: str, outcome: str = "served", status: int | None = 200, **kw) -> dict:
    return {"id": rid, "direction": direction, "node": node, "outcome": outcome, "status": status,
            "failedOverFrom": [], "attempts": [], "requestError": None, "clientClosed": False, **kw}


def _consistent() -> tuple[History, dict[str, list[dict]]]:
    h = History()
    ops = [
        Op(0, "hub-a", "/api/chat", 0.0, 0.0, status=200, rid="r-local", served_by="local", final=True, tokens=3),
        Op(1, "hub-a", "/api/chat", 0.0, 0.0, status=200, rid="r-peer", served_by=FQDNS["hub-b"], final=True),
        Op(2, "hub-a", "/api/chat", 0.0, 0.0, status=200, rid="r-cut", served_by=FQDNS["hub-b"]),
        Op(3, "hub-a", "/api/chat", 0.0, 0.0, status=502, rid="r-502"),
        Op(4, "hub-b", "/api/chat", 0.0, 0.0, status=200, rid="r-gone", served_by="local", abandoned=True),
    ]
    for op in ops:
        History.complete(op)
        h.ops.append(op)
    assert [op.outcome for op in ops] == [OK, OK, INDETERMINATE, FAIL, INDETERMINATE]
    cut = {"signature": "truncated-upstream", "basis": "node", "confirms": None}
    logs = {
        "hub-a": [
            _row("r-local", "outbound", "local"),
            _row("r-peer", "outbound", FQDNS["hub-b"]),
            _row("r-cut", "outbound", FQDNS["hub-b"], "failed", 200, requestError=cut),
            # its only candidate answered 503: the walk ran out there, which is no failover
            # (issue 26.19), so the row names it and says why in its reason
            _row("r-502", "outbound", FQDNS["hub-b"], "failed", 502, reason="HTTP 503"),
        ],
        "hub-b": [
            _row("r-peer", "inbound", FQDNS["hub-a"]),
            _row("r-cut", "inbound", FQDNS["hub-a"], "failed", 200),
            _row("r-502", "inbound", FQDNS["hub-a"], "failed", 503),
            _row("r-gone", "outbound", "local", "failed", 200, clientClosed=True),
        ],
    }
    return h, logs


def test_a_consistent_run_reconciles():
    h, logs = _consistent()
    rec = reconcile(h, logs, FQDNS)
    assert rec.ok(), rec.problems
    assert rec.matched == 5 and rec.inbound_checked == 3


def _drop(logs, node, rid, direction="outbound"):
    logs[node] = [r for r in logs[node] if not (r["id"] == rid and r["direction"] == direction)]


PLANTS = {
    "missing outbound row": lambda h, logs: _drop(logs, "hub-a", "r-peer"),
    "row no client sent": lambda h, logs: logs["hub-a"].append(_row("r-ghost", "outbound", "local")),
    "duplicate row": lambda h, logs: logs["hub-a"].append(copy.deepcopy(logs["hub-a"][0])),
    "outbound on two nodes": lambda h, logs: logs["hub-b"].append(_row("r-local", "outbound", "local")),
    "served row for a cut stream": lambda h, logs: logs["hub-a"][2].update(outcome="served", requestError=None),
    "failed row for a whole answer": lambda h, logs: logs["hub-a"][0].update(outcome="failed"),
    "wrong serving node": lambda h, logs: logs["hub-a"][1].update(node="hub-c.t.ts.net"),
    "status disagrees": lambda h, logs: logs["hub-a"][3].update(status=504),
    "hang-up not clientClosed": lambda h, logs: logs["hub-b"][3].update(clientClosed=False),
    "clientClosed on a whole answer": lambda h, logs: logs["hub-a"][0].update(clientClosed=True),
    "inbound row without its sender's": lambda h, logs: logs["hub-b"].append(_row("r-x", "inbound", FQDNS["hub-a"])),
    "served inbound, sender names another": lambda h, logs: logs["hub-b"][2].update(outcome="served"),
    "missing inbound row for a peer's answer": lambda h, logs: _drop(logs, "hub-b", "r-peer", "inbound"),
    "pending row": lambda h, logs: logs["hub-a"][0].update(outcome="pending"),
    "lost before headers": lambda h, logs: h.ops.append(Op(9, "hub-a", "/api/chat", 0.0, 0.0, outcome=FAIL)),
    "two ops one id": lambda h, logs: h.ops.append(copy.deepcopy(h.ops[0])),
}


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_each_planted_disagreement_is_reported(plant):
    h, logs = _consistent()
    PLANTS[plant](h, logs)
    rec = reconcile(h, logs, FQDNS)
    assert not rec.ok(), plant
