"""F7: a client hang-up travels the whole pool hop. The app talks to hub-a, whose pin sends the
work to hub-b; the app hangs up (mid-stream, and before headers during a slow prefill). hub-b's
engine — the far hop — sees its request aborted within 500 ms of the hang-up, and both routing
log rows (hub-a outbound, hub-b inbound, one request id) say clientClosed."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from history import History, read_stream
from rig import Rig, chat_body, sim_args

pytestmark = [pytest.mark.fault, pytest.mark.timeout(150)]
LIMIT_S = 0.5


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    with Rig(tmp_path_factory.mktemp("f7"), ["hub-a", "hub-b"], sim=sim_args(ms_per_token=50, tokens=200)) as r:
        a = r.nodes["hub-a"]
        a.op("POST", "/pins", {"scope": "default", "targetKind": "peer", "targetPeerId": a.peer_id("hub-b")})
        yield r


def _aborted(rig: Rig) -> int:
    return rig.sims["hub-b"].stats()["aborted"]


def _wait_abort(rig: Rig, before: int, closed_at: float) -> float:
    deadline = closed_at + 5
    while time.monotonic() < deadline:
        if _aborted(rig) > before:
            return time.monotonic() - closed_at
        time.sleep(0.01)
    raise AssertionError("hub-b's engine never saw the request aborted")


def _rows(rig: Rig, rid: str) -> tuple[dict, dict]:
    deadline = time.monotonic() + 5
    while True:
        a = next((r for r in rig.log("hub-a") if r["id"] == rid), None)
        b = next((r for r in rig.log("hub-b") if r["id"] == rid), None)
        if a and b and a["outcome"] != "pending" and b["outcome"] != "pending":
            return a, b
        assert time.monotonic() < deadline, (a, b)
        time.sleep(0.05)


@pytest.mark.parametrize("route", ["/api/chat", "/v1/chat/completions"])
def test_f7_a_hangup_mid_stream_reaches_the_far_engine_within_500ms(rig, route, report):
    history = History()
    latencies = []
    for trial in range(3):
        before = _aborted(rig)
        op = history.invoke("hub-a", route)
        with httpx.Client(timeout=10, trust_env=False) as c:
            with c.stream("POST", rig.nodes["hub-a"].url + route, json=chat_body(route, f"f7 {trial}")) as r:
                op.status, op.rid = r.status_code, r.headers.get("x-hub-pool-request-id")
                op.served_by = r.headers.get("x-hub-pool-served-by")
                read_stream(r, op, stop_after_tokens=5)
            closed_at = time.monotonic()  # leaving the block closed the connection
        History.complete(op)
        assert op.abandoned and op.tokens == 5 and op.served_by == rig.fqdns["hub-b"], op.brief()
        latencies.append(_wait_abort(rig, before, closed_at))
        a_row, b_row = _rows(rig, op.rid)
        assert a_row["clientClosed"] is True and b_row["clientClosed"] is True, (a_row, b_row)
        assert b_row["direction"] == "inbound" and b_row["node"] == rig.fqdns["hub-a"]
    assert max(latencies) <= LIMIT_S, latencies
    report(f"F7-midstream{route}", {"trials": len(latencies), "maxAbortMs": round(max(latencies) * 1000),
                                    "latenciesMs": [round(x * 1000) for x in latencies]})


def test_f7_a_hangup_before_headers_reaches_the_far_engine_within_500ms(rig, report):
    """The far engine is prefilling (2 s) when the app goes: nothing failed over, both rows
    clientClosed, hub-a's naming hub-b, the node it was waiting on."""
    sim = rig.sims["hub-b"]
    sim.control("POST", "/_sim/config", {"prefill_tps": 20})
    latencies, rids = [], []
    try:
        for trial in range(3):
            before = _aborted(rig)
            requests_before = sim.stats()["requests"]
            body = chat_body("/api/chat", f"f7 prefill {trial} " + "pad " * 40)
            raw = httpx.Request("POST", rig.nodes["hub-a"].url + "/api/chat", json=body)
            sock = socket.create_connection(("127.0.0.1", rig.nodes["hub-a"].port), timeout=5)
            head = (f"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(raw.content)}\r\n\r\n").encode()
            sock.sendall(head + raw.content)
            deadline = time.monotonic() + 5
            while sim.stats()["requests"] == requests_before:  # the forward reached the far engine
                assert time.monotonic() < deadline
                time.sleep(0.01)
            time.sleep(0.3)
            sock.close()
            closed_at = time.monotonic()
            latencies.append(_wait_abort(rig, before, closed_at))
            a_rows = [r for r in rig.log("hub-a") if r["clientClosed"]]
            rid = max(a_rows, key=lambda r: r["at"])["id"]
            rids.append(rid)
            a_row, b_row = _rows(rig, rid)
            assert a_row["clientClosed"] and b_row["clientClosed"], (a_row, b_row)
            assert (a_row["outcome"], a_row["status"], a_row["node"]) == ("failed", None, rig.fqdns["hub-b"]), a_row
            assert a_row["failedOverFrom"] == [] and len(a_row["attempts"]) == 0, a_row
    finally:
        sim.control("POST", "/_sim/config", {"prefill_tps": 0})
    assert len(set(rids)) == 3
    assert max(latencies) <= LIMIT_S, latencies
    report("F7-beforeHeaders", {"trials": 3, "maxAbortMs": round(max(latencies) * 1000),
                                "latenciesMs": [round(x * 1000) for x in latencies]})
