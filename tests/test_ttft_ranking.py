"""Predicted time to first token through real nodes (hubpool's own ranking, docs/placement.md):
the issue's slow-box case placed on the fast box, residency and load time advertised and
used, and the fresher load a forwarded answer reports."""

from __future__ import annotations

import threading
from contextlib import ExitStack

import httpx
import pytest
from harness import fqdn, make_pool, poll_until_offered
from harness import pair as pair_nodes

from hubpool_sim import SimConfig, SimModel, run_in_thread

P = "/api/inference/pool"
MODEL = "chat:8b"
COLD = "cold:8b"


def op(node, method, path, body=None, expect=200):
    with node.client(headers=node.headers()) as c:
        r = c.request(method, P + path, json=body)
    assert expect is None or r.status_code == expect, (r.status_code, r.text)
    return r.json()


def ask(node, tokens, model=MODEL, max_tokens=2, timeout=60):
    text = "x" * (tokens * 4)
    return httpx.post(node.url + "/v1/chat/completions", timeout=timeout,
                      json={"model": model, "max_tokens": max_tokens, "stream": True,
                            "messages": [{"role": "user", "content": text}]})


def row(node, response):
    rid = response.headers["x-hub-pool-request-id"]
    return next(e for e in op(node, "GET", "/routing-log?limit=500")["entries"] if e["id"] == rid)


@pytest.fixture
def boxes(tmp_path):
    """hub-a: a slow 1-slot box (400 tok/s), the entry node; hub-b: a fast 4-slot box
    (4,000 tok/s); each a llama-server-shaped simulator reporting timings and slots, and an
    Ollama-shaped one holding cold:8b (resident on hub-b only, 3 s to load)."""
    with ExitStack() as stack:
        def sim(**kw):
            return stack.enter_context(run_in_thread(SimConfig(**kw)))

        slow = sim(flavor="llamacpp", slots=1, prefill_tps=400, decode_ms_per_token=5, timings=True,
                   models=[SimModel(MODEL, window=65536)])
        fast = sim(flavor="llamacpp", slots=4, prefill_tps=4000, decode_ms_per_token=5, timings=True,
                   models=[SimModel(MODEL, window=65536)])
        cold_a = sim(flavor="ollama", load_ms=3000, models=[SimModel(COLD)])
        cold_b = sim(flavor="ollama", load_ms=3000, models=[SimModel(COLD)], preloaded=[COLD])
        nodes = make_pool(tmp_path, ["hub-a", "hub-b"], environ={"HUB_POOL_DEV_HEALTH_POLL_SECONDS": "1"},
                          per_node={"hub-a": {"LLAMACPP_URL": slow.url, "OLLAMA_URL": cold_a.url},
                                    "hub-b": {"LLAMACPP_URL": fast.url, "OLLAMA_URL": cold_b.url}})
        for n in nodes.values():
            n.start()
        a, b = nodes["hub-a"], nodes["hub-b"]
        pair_nodes(a, b)
        poll_until_offered(a, [b], MODEL)
        yield a, b, fast
        for n in nodes.values():
            n.stop()


def _measured_then_fast_box_busy(a, b) -> list[threading.Thread]:
    """Each box measured once (the slow box's own engine, and the fast box through a pin), then
    two long answers started on the fast box by its own apps: the threads carrying them."""
    assert ask(a, 1200).headers["x-hub-pool-served-by"] == "local"
    op(a, "POST", "/pins", {"scope": "default", "targetKind": "peer", "targetPeerId": a.node.peers.by_fqdn(
        fqdn("hub-b")).id})
    assert ask(a, 1200).headers["x-hub-pool-served-by"] == fqdn("hub-b")
    op(a, "DELETE", "/pins?scope=default")
    held = [threading.Thread(target=ask, args=(b, 100), kwargs={"max_tokens": 1000}) for _ in range(2)]
    for t in held:
        t.start()
    return held


def test_the_idle_slow_box_gives_way_to_the_fast_box_with_two_in_flight(boxes):
    a, b, fast = boxes
    held = _measured_then_fast_box_busy(a, b)
    try:
        assert _until(lambda: fast.stats()["in_flight"] == 2)
        a.run(a.node.health.poll_once())  # the entry node sees them (the spec's poll)
        peer = next(p for p in op(a, "GET", "/status")["peers"] if p["nodeFqdn"] == fqdn("hub-b"))
        assert peer["lastCapabilities"]["inFlightRequests"] == 2
        assert peer["lastCapabilities"]["engineSlots"] == [{"backend": "llamacpp", "slots": 4}]
        # the spec's queue-depth order (the setting off): the idle slow box takes it
        op(a, "PATCH", "/settings", {"poolTtftRanking": 0})
        spec = ask(a, 2000)
        assert spec.headers["x-hub-pool-served-by"] == "local" and row(a, spec)["ttft"] is None
        op(a, "PATCH", "/settings", {"poolTtftRanking": 1})
        a.run(a.node.health.poll_once())
        r = ask(a, 2000)
        assert r.status_code == 200
        assert r.headers["x-hub-pool-served-by"] == fqdn("hub-b")
        section = row(a, r)["ttft"]
        by = {p["node"]: p for p in section["predictions"]}
        assert by[fqdn("hub-b")]["inFlight"] == 2 and by[fqdn("hub-b")]["slots"] == 4
        assert by[fqdn("hub-b")]["waitMs"] == 0
        assert by["local"]["predictedMs"] > 5 * by[fqdn("hub-b")]["predictedMs"]
        assert section["moved"] is True
    finally:
        for t in held:
            t.join()


def test_residency_and_load_time_are_advertised_and_a_cold_model_goes_to_the_warm_node(boxes):
    a, b, _ = boxes
    for n in (a, b):
        # an engine never probed is sampled as unknown: at TTL 0 nothing probes hub-a's own
        # engines until a request or hub-b's poll does, which raced the sample (CI, 2026-12-06)
        n.run(n.node.local.read(0, budget_ms=10_000))
        n.run(n.node.residency_sampler.sample())
    a.run(a.node.health.poll_once())
    caps = next(p for p in op(a, "GET", "/status")["peers"] if p["nodeFqdn"] == fqdn("hub-b"))["lastCapabilities"]
    resident = {e["backend"]: e["models"] for e in caps["resident"]}
    assert resident["ollama"] == [COLD]  # hub-b's Ollama holds it (/api/ps)
    assert resident["llamacpp"] == [MODEL]  # no residency API: what it lists is loaded
    status = op(a, "GET", "/status")["localNode"]
    assert {"backend": "ollama", "models": []} in status["resident"]  # hub-a's copy is on disk only
    # nothing measured of the cold model anywhere: the warm node answers its first requests
    a.node.speed.record_read("local", "ollama", COLD, 1000, 100)
    a.node.speed.record_read(fqdn("hub-b"), "ollama", COLD, 1000, 100)
    r = ask(a, 200, model=COLD)
    assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] == fqdn("hub-b")
    by = {p["node"]: p for p in row(a, r)["ttft"]["predictions"]}
    assert by["local"]["loadMs"] > 0 and by[fqdn("hub-b")]["loadMs"] == 0
    # once hub-a loads it (a pin sends one there), the load is measured and it is resident
    op(a, "POST", "/pins", {"scope": "default", "targetKind": "local"})
    assert ask(a, 200, model=COLD).headers["x-hub-pool-served-by"] == "local"
    op(a, "DELETE", "/pins?scope=default")
    speed = a.node.speed.get("local", "ollama", COLD)
    assert speed.load_ms is not None and speed.load_ms >= 2500
    assert a.node.residency.resident("local", "ollama", COLD) is True
    out = op(a, "GET", "/status")["localNode"]
    assert any(s["model"] == COLD and s.get("loadMs", 0) >= 2500 for s in out["speed"])


def test_a_forwarded_answer_carries_the_serving_nodes_load(boxes):
    a, b, fast = boxes
    op(a, "POST", "/pins", {"scope": "default", "targetKind": "peer", "targetPeerId": a.node.peers.by_fqdn(
        fqdn("hub-b")).id})
    assert ask(b, 100).status_code == 200  # hub-b measures its engine: its work has a length
    held = threading.Thread(target=ask, args=(b, 100), kwargs={"max_tokens": 300})
    held.start()
    try:
        assert _until(lambda: fast.stats()["in_flight"] == 1)
        stated = []
        note = a.node.peer_slots.note
        a.node.peer_slots.note = lambda *args: (stated.append(args), note(*args))
        r = ask(a, 100)
        assert r.headers["x-hub-pool-served-by"] == fqdn("hub-b")
        assert "x-hub-pool-in-flight" not in r.headers  # the peer's statement is for the entry node only
        assert "x-hub-pool-slots-free-ms" not in r.headers
        peer_id = a.node.peers.by_fqdn(fqdn("hub-b")).id
        # and its engine's schedule (docs/placement.md, "the slot clock"): a time for each of its
        # four slots, stated beside the two requests it then had in flight
        assert any(p == peer_id and backend == "llamacpp" and len(free) == 4 and count == 2
                   for p, backend, free, count in stated), stated
        # hub-b had its own app's request and this one in flight as it answered: one beyond ours,
        # known at once, not at the next poll
        assert _until(lambda: a.node.load.forwarded.get(peer_id, 0) == 0)  # ours released
        assert a.node.load.peer_load(peer_id, 0) == 1
    finally:
        held.join()


def _until(predicate, timeout=10.0):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_throughput_placement_off_stops_the_prediction_and_nothing_is_hashed(boxes, monkeypatch):
    """issue 26 item 17: HUB_POOL_THROUGHPUT_PLACEMENT=off turns the predicted-TTFT ordering off
    too (the spec's switch for measured speed reordering candidates), and with affinity at 0
    no prompt head is hashed for a feature that is off."""
    import hubpool_stages.affinity as affinity

    a, b, fast = boxes
    held = _measured_then_fast_box_busy(a, b)
    heads = []
    real = affinity.prompt_head
    monkeypatch.setattr(affinity, "prompt_head", lambda *a_, **k: heads.append(1) or real(*a_, **k))
    try:
        assert _until(lambda: fast.stats()["in_flight"] == 2)
        a.run(a.node.health.poll_once())
        assert op(a, "GET", "/settings")["poolTtftRanking"] == 1
        heads.clear()  # hub-b placed its own two with the ranking on
        monkeypatch.setenv("HUB_POOL_THROUGHPUT_PLACEMENT", "off")
        off = ask(a, 2000)
        # measured speed no longer reorders: the spec's queue-depth order sends it to the idle local box
        assert off.status_code == 200 and off.headers["x-hub-pool-served-by"] == "local"
        assert row(a, off)["ttft"] is None
        assert heads == []  # nothing hashed: neither affinity (0) nor the prediction (off) needs it
        monkeypatch.delenv("HUB_POOL_THROUGHPUT_PLACEMENT")
        on = ask(a, 2000)
        assert on.headers["x-hub-pool-served-by"] == fqdn("hub-b") and row(a, on)["ttft"]["moved"] is True
        assert heads  # on, the prediction reads the session's head for what each engine holds
    finally:
        for t in held:
            t.join()
