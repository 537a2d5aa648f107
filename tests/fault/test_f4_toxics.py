"""F4 (the wire half): every toxic of the fault proxy on the hop hub-a → hub-b, before and after
the commit point (since issue 28, the stream's first real token reaching the app; before it, the
moment response headers did).

hub-a's pin sends each request to hub-b through the proxy. Before the commit point a fault must
cost the app nothing: the request fails over to hub-a's own engine (or, for latency and 1-byte
slices, which are not faults, hub-b serves it whole). After it, nothing can be recalled: a cut
stream reaches the app without a final frame and its row says failed / truncated-upstream; a
stream that goes silent is ended by the app, and its row says clientClosed; latency and slices
still deliver the whole answer. Every operation reconciles with both routing logs."""

from __future__ import annotations

import time

import httpx
import pytest
from faultproxy import Toxic
from history import INDETERMINATE, OK, History, reconcile, run_op
from rig import Rig, chat_body, sim_args

pytestmark = [pytest.mark.fault, pytest.mark.timeout(240)]
BUDGET_MS = 2000
TOKENS = 12
ROUTES = ("/api/chat", "/v1/chat/completions")
#: the app's own read timeout: how long it waits on a silent stream before hanging up
CLIENT_READ_S = 3.0


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    env = {"HUB_POOL_FIRST_BYTE_TIMEOUT_MS": str(BUDGET_MS), "HUB_POOL_MIN_PREFILL_TOKENS_PER_SEC": "1000000"}
    with Rig(tmp_path_factory.mktemp("f4"), ["hub-a", "hub-b"], sim=sim_args(ms_per_token=20, tokens=TOKENS),
             env=env, proxied=[("hub-a", "hub-b")]) as r:
        a = r.nodes["hub-a"]
        a.op("POST", "/pins", {"scope": "default", "targetKind": "peer", "targetPeerId": a.peer_id("hub-b")})
        r.history = History()
        r.before = {row["id"] for rows in r.logs().values() for row in rows}
        yield r


def _head_len(rig: Rig) -> int:
    """The length of hub-b's response head on this hop, measured on a clean forward."""
    proxy = rig.proxies[("hub-a", "hub-b")]
    proxy.clear()
    with httpx.Client(timeout=10, trust_env=False) as c:
        op = run_op(c, rig.history, "hub-a", rig.nodes["hub-a"].url, "/api/chat", chat_body("/api/chat", "head"))
    assert op.outcome == OK and op.served_by == rig.fqdns["hub-b"], op.brief()
    heads = [r.head for r in proxy.records if b"/local/" in r.first_line.encode() and r.head]
    return heads[-1].index(b"\r\n\r\n") + 4


def _one(rig: Rig, toxic: Toxic, route: str, read_s: float = 15.0):
    proxy = rig.proxies[("hub-a", "hub-b")]
    hits_before = len(proxy.hits())
    proxy.arm(toxic)
    try:
        with httpx.Client(timeout=httpx.Timeout(15.0, read=read_s), trust_env=False) as c:
            op = run_op(c, rig.history, "hub-a", rig.nodes["hub-a"].url, route, chat_body(route, f"f4 {toxic.kind}"))
    finally:
        proxy.clear()
    assert len(proxy.hits()) == hits_before + 1, "the toxic met exactly one forward"
    return op


def _row(rig: Rig, node: str, rid: str) -> dict:
    deadline = time.monotonic() + 10
    while True:
        row = next((r for r in rig.log(node) if r["id"] == rid), None)
        if row is not None and row["outcome"] != "pending":
            return row
        assert time.monotonic() < deadline, row
        time.sleep(0.05)


def _clean_answer_from_b(rig: Rig) -> None:
    """A clean answer from hub-b clears its strike (one cut is no withhold; two would be)."""
    with httpx.Client(timeout=10, trust_env=False) as c:
        op = run_op(c, rig.history, "hub-a", rig.nodes["hub-a"].url, "/api/chat", chat_body("/api/chat", "clean"))
    assert op.outcome == OK and op.served_by == rig.fqdns["hub-b"], op.brief()


BEFORE = [
    ("reset", dict(nbytes=0)), ("reset", dict(nbytes=20)), ("close", dict(nbytes=0)), ("close", dict(nbytes=20)),
    ("blackhole", dict(nbytes=0)), ("latency", dict(ms=300)), ("slicer", dict(ms=0)),
]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("kind,kw", BEFORE, ids=[f"{k}-{v}" for k, v in BEFORE])
def test_f4_toxic_before_the_commit_point_costs_the_app_nothing(rig, kind, kw, route, report):
    op = _one(rig, Toxic(kind, **kw), route)
    assert op.outcome == OK and op.tokens == TOKENS and not op.frames_after_final, op.brief()
    row = _row(rig, "hub-a", op.rid)
    b = rig.fqdns["hub-b"]
    if kind in ("latency", "slicer"):
        assert op.served_by == b and row["failedOverFrom"] == [], row  # slow is not broken
        if kind == "latency":
            assert op.headers_at - op.invoked >= kw["ms"] / 1000, "the head itself was delayed"
    else:
        assert op.served_by == "local" and row["failedOverFrom"] == [b], row
        reason = row["attempts"][0]["reason"]
        if kind == "blackhole":
            assert reason == f"No response headers within {BUDGET_MS}ms", reason
            assert BUDGET_MS * 0.9 <= (op.headers_at - op.invoked) * 1000 <= BUDGET_MS * 1.1 + 500
        else:
            assert reason.startswith("fetch failed") or "dropped" in reason or "HTTP" in reason, reason


AFTER = [("reset", "cut"), ("close", "cut"), ("blackhole", "silent"), ("latency", "whole"), ("slicer", "whole")]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("kind,expect", AFTER)
def test_f4_toxic_after_the_commit_point_is_never_dressed_as_an_answer(rig, kind, expect, route, report):
    head = _head_len(rig)
    # past the head and a few frames into the body: past the first real token (the commit point),
    # which on /v1/chat/completions follows a role-only chunk of ~170 bytes that commits nothing
    nbytes = head + 600
    toxic = Toxic(kind, nbytes=nbytes, ms=100 if kind == "latency" else 0)
    op = _one(rig, toxic, route, read_s=CLIENT_READ_S if kind == "blackhole" else 15.0)
    b = rig.fqdns["hub-b"]
    assert op.status == 200 and op.served_by == b, op.brief()
    row = _row(rig, "hub-a", op.rid)
    if expect == "whole":
        assert op.outcome == OK and op.tokens == TOKENS, op.brief()
        assert (row["outcome"], row["status"]) == ("served", 200), row
        return
    assert not op.final and op.tokens < TOKENS, op.brief()  # no invented ending
    if expect == "cut":
        assert op.outcome == INDETERMINATE, op.brief()
        assert (row["outcome"], (row["requestError"] or {}).get("signature")) == ("failed", "truncated-upstream"), row
        assert not row["clientClosed"], row
    else:  # silent: the app's read timeout ends it; the row says the app hung up
        op.abandoned = True
        History.complete(op)
        assert row["clientClosed"] is True, row
    _clean_answer_from_b(rig)


def test_f4_history_reconciles_with_both_logs(rig, report):
    """Runs last in this module: every operation above, one to one with the routing logs."""
    ops = rig.history.ops
    assert len(ops) >= 2 * (len(BEFORE) + 2 * len(AFTER)), len(ops)
    logs = rig.logs()
    rec = reconcile(rig.history, logs, rig.fqdns, ignore=rig.before)
    assert rec.ok(), rec.problems[:10]
    proxy = rig.proxies[("hub-a", "hub-b")]
    report("F4-toxics", {"operations": len(ops), "byOutcome": rec.by_outcome, "reconciled": rec.matched,
                         "inboundRowsChecked": rec.inbound_checked,
                         "toxicHits": {k: len(proxy.hits(k)) for k in ("latency", "reset", "close", "blackhole",
                                                                        "slicer")}})
