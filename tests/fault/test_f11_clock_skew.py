"""F11: skewed clocks, per node (HUB_POOL_DEV_CLOCK_OFFSET_MS, the test-only clock override read
by the signer, the guard and the health tick alike).

- Up to ±290 s apart (inside the spec's ±300 s window for a signed request) nodes pair with a
  PIN, poll each other and forward without a single refusal, in both directions.
- At ±310 s one node's signatures are refused as the spec says (401 `Invalid pool peer
  credentials`; the probe reads "unauthorized" and backs off from two polls), nothing is
  forwarded to it or from it, and the operator is told which clock is wrong: on the skewed
  node `status` and `doctor` say its own clock is (every peer it reads is off the same way),
  on the others they name the skewed node (a third node agrees with them). Set right, it is
  connected again on the first poll after the back-off.

In-thread nodes on loopback (tests/harness.py); one simulated engine, on hub-b.
"""

from __future__ import annotations

import httpx
import pytest
from harness import fqdn, make_pool, pair, poll_until_offered
from test_f9_clocks import FrozenClock

from hubpool_core.peering import health, signing
from hubpool_sim import SimConfig, SimModel, run_in_thread

pytestmark = [pytest.mark.fault, pytest.mark.timeout(180)]

MODEL = "llama3.2:3b"
P = "/api/inference/pool"
OFFSET = "HUB_POOL_DEV_CLOCK_OFFSET_MS"


def _chat(node, tag: str) -> httpx.Response:
    with node.client() as c:
        return c.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": tag}]})


def _status_peers(node) -> dict[str, dict]:
    with node.client(headers=node.headers()) as c:
        return {p["nodeFqdn"]: p for p in c.get(P + "/status").json()["peers"]}


def _doctor_clock(node) -> dict:
    from hubpool_core.node.doctor import run_checks

    return next(c for c in node.run(run_checks(node.node)) if c["id"] == "T1")


def _poll(node, times: int = 1) -> None:
    for _ in range(times):
        node.run(node.node.health.poll_once())


def _inbound_refusals(node) -> list[dict]:
    return [x for x in node.node.routing_log.query(limit=500)["entries"]
            if x["direction"] == "inbound" and (x["status"] or 0) >= 400]


@pytest.fixture
def engine():
    with run_in_thread(SimConfig(flavor="ollama", models=[SimModel(MODEL)])) as sim:
        yield sim


def test_f11_290_s_either_way_pairs_polls_and_forwards_without_refusals(tmp_path, engine, report):
    # hub-a runs 290 s ahead of hub-b, hub-c 290 s behind (580 s from hub-a: they are not paired)
    nodes = make_pool(tmp_path, ["hub-a", "hub-b", "hub-c"],
                      per_node={"hub-a": {OFFSET: "290000"}, "hub-b": {"OLLAMA_URL": engine.url},
                                "hub-c": {OFFSET: "-290000"}})
    a, b, c = (nodes[n].start() for n in ("hub-a", "hub-b", "hub-c"))
    try:
        pair(a, b)  # with a PIN, signed from the first exchange on
        pair(b, c)
        for node in (a, b, c):
            node.run(node.node.health.stop())  # the test drives every poll
        for node in (a, c):
            poll_until_offered(node, [b], MODEL)
        _poll(b, 3)
        for node in (a, c):
            _poll(node, 3)
            assert not node.node.health.failures, node.node.health.failures
            peer = _status_peers(node)[fqdn("hub-b")]
            assert peer["status"] == "connected" and peer["probeFailure"] is None, peer
            assert peer["authMode"] == "signed", peer
        assert not b.node.health.failures, b.node.health.failures
        seen = {fqdn(n): b.node.health.clocks[b.node.peers.by_fqdn(fqdn(n)).id] for n in ("hub-a", "hub-c")}
        # the clocks each side reads are the offsets, within a loaded box's round trip
        assert abs(seen[fqdn("hub-a")] - 290_000) < 5_000 and abs(seen[fqdn("hub-c")] + 290_000) < 5_000, seen
        served = {}
        for name, node in (("hub-a", a), ("hub-c", c)):
            for i in range(3):
                r = _chat(node, f"{name} {i}")
                assert r.status_code == 200, (name, r.text)
                assert r.headers["x-hub-pool-served-by"] == fqdn("hub-b"), (name, r.headers)
                served[name] = served.get(name, 0) + 1
        assert not _inbound_refusals(b)
        # doctor names the nearness of the limit, and that two clocks alone cannot say who is wrong
        t1 = _doctor_clock(a)
        assert t1["verdict"] != "ready" and "290 s" in t1["detail"] and "no third node" in t1["detail"], t1
        report("F11-290s", {"skewMsSeenByHubB": seen, "servedByHubB": served, "refusals": 0})
    finally:
        for node in (a, b, c):
            node.stop()


@pytest.mark.parametrize("skew_s", [310, -310])
def test_f11_310_s_is_refused_and_the_wrong_clock_is_named(tmp_path, engine, monkeypatch, report, skew_s):
    clock = FrozenClock(1_800_000_000.0)  # the health tick's own clock: it drives the back-off
    monkeypatch.setattr(health, "time", clock)
    nodes = make_pool(tmp_path, ["hub-a", "hub-b", "hub-c"], per_node={"hub-b": {"OLLAMA_URL": engine.url}})
    a, b, c = (nodes[n].start() for n in ("hub-a", "hub-b", "hub-c"))
    try:
        pair(a, b)
        pair(a, c)
        pair(b, c)
        for node in (a, b, c):
            node.run(node.node.health.stop())
        poll_until_offered(a, [b], MODEL)
        poll_until_offered(c, [b], MODEL)
        assert _chat(a, "before").headers["x-hub-pool-served-by"] == fqdn("hub-b")

        a.node.clock_offset_ms = skew_s * 1000  # hub-a's clock jumps (a laptop waking, a bad NTP source)
        # the spec's refusal, to the letter: a signed call from hub-a now carries a timestamp
        # 310 s off hub-b's clock
        kp = a.node.identity.get()
        signed = signing.sign_headers(kp, "GET", P + "/capabilities", kp.node_uuid, fqdn("hub-a"),
                                      b.node.identity.get().node_uuid, None,
                                      now_ms=signing.clock_ms(a.node.clock_offset_ms))
        refused = httpx.get(b.url + P + "/capabilities", headers=signed, trust_env=False)
        assert refused.status_code == 401 and refused.json() == {"error": "Invalid pool peer credentials"}, \
            refused.text
        assert abs(int(refused.headers[health.CLOCK_HEADER]) - signing.clock_ms(0)) < 5_000

        for node in (b, c, a):
            _poll(node)
        way = "ahead of" if skew_s > 0 else "behind"
        mine = way  # hub-a against its peers
        # hub-b and hub-c: hub-a refuses them (their timestamps are 310 s off its clock) and the
        # other one agrees with them, so hub-a's clock is named
        for observer, other in ((b, "hub-c"), (c, "hub-b")):
            failure = observer.node.health.failures[observer.node.peers.by_fqdn(fqdn("hub-a")).id]
            assert failure.kind == "unauthorized" and failure.http_status == 401, failure
            assert failure.next_probe_at == clock.t + 2 * observer.node.health.poll_s, "backed off from two polls"
            assert abs(failure.clock_skew_ms - skew_s * 1000) < 5_000, failure
            peer = _status_peers(observer)[fqdn("hub-a")]
            action = peer["probeFailure"]["action"]
            assert f"{fqdn('hub-a')}'s clock is 310 s {way} this node's" in action, action
            assert f"{fqdn(other)} agrees with this node, so {fqdn('hub-a')}'s clock is wrong" in action, action
            t1 = _doctor_clock(observer)
            assert t1["verdict"] == "needs action" and f"{fqdn('hub-a')}'s clock is wrong" in t1["detail"], t1
            assert f"{fqdn('hub-a')}'s clock is wrong" in _printed_status(observer)
        # hub-a: every peer is off the same way, so its own clock is named
        for other in ("hub-b", "hub-c"):
            failure = a.node.health.failures[a.node.peers.by_fqdn(fqdn(other)).id]
            assert failure.kind == "unauthorized" and failure.http_status == 401, failure
            action = _status_peers(a)[fqdn(other)]["probeFailure"]["action"]
            assert f"this node's clock is 310 s {mine} {fqdn(other)}'s" in action, action
            assert "so this node's clock is wrong" in action, action
        t1 = _doctor_clock(a)
        assert t1["verdict"] == "needs action" and "this node's clock is wrong" in t1["detail"], t1
        # nothing goes to or from hub-a: its chat is not served by hub-b, and hub-b's log shows
        # no request from hub-a served
        before = len([x for x in b.node.routing_log.query(limit=500)["entries"] if x["direction"] == "inbound"
                      and x["outcome"] == "served"])
        r = _chat(a, "while skewed")
        assert r.headers.get("x-hub-pool-served-by") != fqdn("hub-b"), r.headers
        after = len([x for x in b.node.routing_log.query(limit=500)["entries"] if x["direction"] == "inbound"
                     and x["outcome"] == "served"])
        assert after == before
        assert _chat(c, "hub-c still served").headers["x-hub-pool-served-by"] == fqdn("hub-b")

        # set right: after the back-off, one poll each and everyone is connected again
        a.node.clock_offset_ms = 0
        clock.t += 2 * a.node.health.poll_s
        for node in (a, b, c):
            _poll(node)
        for node in (a, b, c):
            assert not node.node.health.failures, node.node.health.failures
        poll_until_offered(a, [b], MODEL)
        assert _chat(a, "after").headers["x-hub-pool-served-by"] == fqdn("hub-b")
        assert _doctor_clock(a)["verdict"] == "ready"
        report(f"F11-{skew_s:+d}s", {"refusal": refused.status_code, "namedOnSkewedNode": "this node",
                                     "namedOnOthers": fqdn("hub-a"), "recoveredPolls": 1})
    finally:
        for node in (a, b, c):
            node.stop()


def _printed_status(node) -> str:
    """What `hubpool status` prints (the CLI's own formatter over the operator route)."""
    from hubpool_core.cli.status_commands import _status_lines

    with node.client(headers=node.headers()) as c:
        return "\n".join(_status_lines(c.get(P + "/status").json()))
