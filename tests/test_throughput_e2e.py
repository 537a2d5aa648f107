"""Throughput evidence through running nodes: a long prompt served alone is measured from
the engine's own timings, advertised in capabilities, and seen by a peer."""

from __future__ import annotations

import httpx

from harness import fqdn, make_pool
from hubpool_sim import SimConfig, SimModel, run_in_thread

P = "/api/inference/pool"


def op(node, method, path, body=None):
    with node.client(headers=node.headers()) as c:
        r = c.request(method, P + path, json=body)
    assert r.status_code < 400, r.text
    return r.json()


def test_a_long_prompt_is_measured_advertised_and_seen_by_a_peer(tmp_path):
    cfg = SimConfig(flavor="ollama", models=[SimModel("big:8b", window=65536)], prefill_tps=20_000)
    with run_in_thread(cfg) as sim:
        nodes = make_pool(tmp_path, ["hub-a", "hub-b"], per_node={"hub-b": {"OLLAMA_URL": sim.url}})
        for n in nodes.values():
            n.start()
        a, b = nodes["hub-a"], nodes["hub-b"]
        try:
            pin = op(b, "POST", "/pairing-pin")["pin"]
            op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-b"), "pin": pin})
            op(b, "POST", f"/peers/{fqdn('hub-a')}/approve")
            a.run(a.node.health.poll_once())
            small = httpx.post(b.url + "/api/chat", json={"model": "big:8b", "stream": False,
                                                          "messages": [{"role": "user", "content": "hi"}]})
            assert small.status_code == 200
            assert op(b, "GET", "/status")["localNode"]["throughput"] == []  # under 4,096 tokens: not measured
            long_turn = "word " * 5000  # ~25 KB: ~6,300 estimated tokens
            r = httpx.post(a.url + "/api/chat", json={"model": "big:8b", "stream": False,
                                                       "messages": [{"role": "user", "content": long_turn}]},
                           timeout=60)
            assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] == fqdn("hub-b")
            own = op(b, "GET", "/status")["localNode"]["throughput"]
            assert own and own[0]["model"] == "big:8b" and own[0]["backend"] == "ollama"
            assert own[0]["prefill"][0]["tokensPerSec"] > 0 and own[0]["prefill"][0]["deadline"] is False
            seen = next(p for p in op(a, "GET", "/status")["peers"] if p["nodeFqdn"] == fqdn("hub-b"))
            assert seen["throughput"]["observed"]  # the entry node timed the peer too
            a.run(a.node.health.poll_once())
            seen = next(p for p in op(a, "GET", "/status")["peers"] if p["nodeFqdn"] == fqdn("hub-b"))
            assert seen["throughput"]["advertised"] and seen["throughput"]["advertised"][0]["model"] == "big:8b"
        finally:
            for n in nodes.values():
                n.stop()
