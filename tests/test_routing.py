"""The pool at work: three real nodes on loopback, each with simulated engines, paired
through the real API. Placement, forwarding, failover, recovery, pins and kill switches."""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack

import httpx
import pytest
from harness import RunningNode, fqdn, make_pool

from hubpool_sim import SimConfig, SimModel, run_in_thread

P = "/api/inference/pool"
CHAT = {"messages": [{"role": "user", "content": "hello"}], "stream": False}


def op(node, method, path, body=None, expect=200):
    with node.client(headers=node.headers()) as c:
        r = c.request(method, P + path, json=body)
    assert expect is None or r.status_code == expect, (r.status_code, r.text)
    return r.json()


def chat(node, model, **extra):
    return httpx.post(node.url + "/api/chat", json={"model": model, **CHAT, **extra}, timeout=60)


def log_row(node, rid):
    return next(e for e in op(node, "GET", "/routing-log?limit=500")["entries"] if e["id"] == rid)


def poll_all(nodes):
    for n in nodes.values():
        if n.thread.is_alive():
            n.run(n.node.health.poll_once())


@pytest.fixture
def pool(tmp_path):
    """hub-a (llama3.2:3b, a-only, mystery of no stated size, nomic-embed-text), hub-b (vLLM: llama3.2:3b,
    qwen3:8b), hub-c (llama3.2:3b, c-only, two Ollama Cloud tags);
    a↔b and a↔c paired (with PINs), b↔c paired without."""
    with ExitStack() as stack:
        sims = {
            "hub-a": stack.enter_context(run_in_thread(SimConfig(flavor="ollama", models=[
                SimModel("llama3.2:3b"), SimModel("a-only:1b"), SimModel("mystery"),
                SimModel("nomic-embed-text", embedding=True)], decode_ms_per_token=0))),
            "hub-b": stack.enter_context(run_in_thread(SimConfig(flavor="vllm", models=[
                SimModel("llama3.2:3b"), SimModel("qwen3:8b")]))),
            "hub-c": stack.enter_context(run_in_thread(SimConfig(flavor="ollama", models=[
                SimModel("llama3.2:3b"), SimModel("c-only:1b"), SimModel("gpt-oss:120b-cloud"),
                SimModel("deepseek-v3.1:671b-cloud")]))),
        }
        engines = {name: {("VLLM_URL" if name == "hub-b" else "OLLAMA_URL"): sim.url} for name, sim in sims.items()}
        nodes = make_pool(tmp_path, list(sims), per_node=engines)
        for n in nodes.values():
            n.start()
        for x, y, use_pin in (("hub-a", "hub-b", True), ("hub-a", "hub-c", True), ("hub-b", "hub-c", False)):
            body = {"nodeFqdn": fqdn(y)}
            if use_pin:
                body["pin"] = op(nodes[y], "POST", "/pairing-pin")["pin"]
            op(nodes[x], "POST", "/peers/pair", body)
            op(nodes[y], "POST", f"/peers/{fqdn(x)}/approve")
        poll_all(nodes)
        poll_all(nodes)  # a second round: every pairing now signs both ways
        yield nodes, sims
        for n in nodes.values():
            if n.thread.is_alive():
                n.stop()


def test_a_model_only_a_peer_holds_is_served_there_and_one_id_joins_both_rows(pool):
    nodes, _ = pool
    a, b = nodes["hub-a"], nodes["hub-b"]
    r = chat(a, "qwen3:8b")
    assert r.status_code == 200, r.text
    assert r.headers["x-hub-pool-served-by"] == fqdn("hub-b")
    assert r.headers["x-hub-pool-backend"] == "vllm"
    assert r.headers["x-hub-pool-model"] == "qwen3:8b"
    assert r.json()["done"] is True  # translated on hub-b: its vLLM speaks only the OpenAI dialect
    rid = r.headers["x-hub-pool-request-id"]
    out, inbound = log_row(a, rid), log_row(b, rid)
    assert out["direction"] == "outbound" and out["node"] == fqdn("hub-b") and out["outcome"] == "served"
    assert inbound["direction"] == "inbound" and inbound["node"] == fqdn("hub-a") and inbound["outcome"] == "served"
    assert inbound["pin"] is None and inbound["requestError"] is None


def test_a_shared_model_on_an_idle_pool_is_served_locally(pool):
    nodes, _ = pool
    r = chat(nodes["hub-a"], "llama3.2:3b")
    assert r.headers["x-hub-pool-served-by"] == "local"
    row = log_row(nodes["hub-a"], r.headers["x-hub-pool-request-id"])
    assert (row["attempt"], row["candidates"]) == (1, 3)


def test_load_handoff_to_an_idle_peer_and_back(pool):
    nodes, sims = pool
    a = nodes["hub-a"]
    sims["hub-a"].configure(decode_ms_per_token=100)
    held, served_by = [], []
    started = threading.Event()

    def long_stream():
        with httpx.stream("POST", a.url + "/api/generate", json={"model": "llama3.2:3b", "prompt": "x",
                                                                  "options": {"num_predict": 30}}, timeout=60) as r:
            held.append(r.headers["x-hub-pool-served-by"])
            started.set()
            for _ in r.iter_raw():
                pass

    threads = [threading.Thread(target=long_stream) for _ in range(2)]
    for t in threads:
        t.start()
        started.wait(10)
        started.clear()
    assert held == ["local", "local"]  # local 0 < peer 0+1, then local 1 ties peer 0+1: local wins ties
    r = chat(a, "llama3.2:3b")  # local 2 > peer 0+1: the idle peer takes it
    served_by.append(r.headers["x-hub-pool-served-by"])
    assert served_by[0] in (fqdn("hub-b"), fqdn("hub-c"))
    for t in threads:
        t.join(30)
    sims["hub-a"].configure(decode_ms_per_token=0)
    assert chat(a, "llama3.2:3b").headers["x-hub-pool-served-by"] == "local"  # drained: back home


def test_failover_when_a_peers_engine_answers_503(pool):
    nodes, sims = pool
    a, b = nodes["hub-a"], nodes["hub-b"]
    op(a, "POST", "/pins", {"scope": "model", "model": "llama3.2:3b", "targetKind": "peer",
                            "targetPeerId": a.node.peers.by_fqdn(fqdn("hub-b")).id})
    sims["hub-b"].add_fault("error:503", count=1)
    r = chat(a, "llama3.2:3b")
    assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] == "local"
    row = log_row(a, r.headers["x-hub-pool-request-id"])
    assert row["failedOverFrom"] == [fqdn("hub-b")]
    assert row["attempts"] == [{"node": fqdn("hub-b"), "backend": "vllm", "status": 503, "reason": "HTTP 503"}]
    assert row["pin"] == {"scope": "model", "mode": "prefer", "targetKind": "peer"}
    assert a.node.peers.by_fqdn(fqdn("hub-b")).last_capabilities is not None  # a 5xx drops nothing


def test_failover_when_a_peer_process_is_dead_before_headers(pool):
    nodes, _ = pool
    a, b = nodes["hub-a"], nodes["hub-b"]
    b.stop()
    r = chat(a, "qwen3:8b")  # only hub-b holds it: nothing else can serve
    assert r.status_code == 502
    assert "All 1 pool candidates" in r.json()["error"] and "ECONNREFUSED" in r.json()["error"]
    assert r.headers["x-hub-pool-request-id"] and "x-hub-pool-served-by" not in r.headers
    op(a, "POST", "/pins", {"scope": "default", "targetKind": "peer",
                            "targetPeerId": a.node.peers.by_fqdn(fqdn("hub-b")).id})
    r = chat(a, "llama3.2:3b")
    assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] != fqdn("hub-b")
    assert log_row(a, r.headers["x-hub-pool-request-id"])["failedOverFrom"] == [fqdn("hub-b")]


@pytest.mark.timeout(90)
def test_failover_when_a_peer_hangs_past_the_header_budget(pool):
    nodes, sims = pool
    a = nodes["hub-a"]
    a.node.budgets.connect_ms = a.node.budgets.completion_ms = 1500  # shortened for the test
    op(a, "POST", "/pins", {"scope": "default", "targetKind": "peer",
                            "targetPeerId": a.node.peers.by_fqdn(fqdn("hub-b")).id})
    sims["hub-b"].add_fault("hang", count=1)
    started = time.monotonic()
    r = chat(a, "llama3.2:3b")
    assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] != fqdn("hub-b")
    assert 1.4 < time.monotonic() - started < 20
    row = log_row(a, r.headers["x-hub-pool-request-id"])
    assert row["attempts"][0]["reason"] == "No response headers within 1500ms"
    # when every candidate misses its deadline the 502 says it was a deadline
    sims["hub-b"].add_fault("hang", count=1)
    r = chat(a, "qwen3:8b")
    assert r.status_code == 502 and "within its deadline" in r.json()["error"]


def test_recovery_without_operator_action_after_the_peer_restarts(pool):
    nodes, sims = pool
    a, b = nodes["hub-a"], nodes["hub-b"]
    port, data_dir, environ = b.port, b.env.data_dir, b.environ
    b.stop()
    for _ in range(3):
        a.run(a.node.health.poll_once())
    assert a.node.peers.by_fqdn(fqdn("hub-b")).status == "unreachable"
    assert chat(a, "qwen3:8b").status_code == 502  # unreachable peers are not candidates
    sock = bound_socket_on(port)
    nodes["hub-b"] = b2 = RunningNode(data_dir, environ, sock=sock).start()
    a.run(a.node.health.poll_once())
    assert a.node.peers.by_fqdn(fqdn("hub-b")).status == "connected"
    r = chat(a, "qwen3:8b")
    assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] == fqdn("hub-b")
    del b2


def bound_socket_on(port):
    import socket

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return sock


def test_disabled_and_unpaired_peers_never_get_work(pool):
    nodes, sims = pool
    a, b, c = nodes["hub-a"], nodes["hub-b"], nodes["hub-c"]
    op(a, "POST", f"/peers/{fqdn('hub-b')}/disable")
    before = sims["hub-b"].stats()["by_path"].get("/v1/chat/completions", 0)
    assert chat(a, "qwen3:8b").status_code == 502
    for _ in range(5):
        assert chat(a, "llama3.2:3b").headers["x-hub-pool-served-by"] != fqdn("hub-b")
    assert sims["hub-b"].stats()["by_path"].get("/v1/chat/completions", 0) == before
    op(a, "POST", f"/peers/{fqdn('hub-b')}/enable")
    assert chat(a, "qwen3:8b").status_code == 200
    op(a, "DELETE", f"/peers/{fqdn('hub-c')}")
    assert chat(a, "c-only:1b").status_code == 502


def test_a_pin_reorders_but_never_resurrects(pool):
    nodes, _ = pool
    a = nodes["hub-a"]
    b_id = a.node.peers.by_fqdn(fqdn("hub-b")).id
    op(a, "POST", "/pins", {"scope": "model", "model": "llama3.2:3b", "targetKind": "peer", "targetPeerId": b_id})
    r = chat(a, "llama3.2:3b")
    assert r.headers["x-hub-pool-served-by"] == fqdn("hub-b")  # reordered ahead of an idle local
    pins = op(a, "GET", "/status")["pins"]
    assert pins[0]["nodeFqdn"] == fqdn("hub-b") and pins[0]["targetAvailable"] is True
    op(a, "POST", f"/peers/{b_id}/disable")
    r = chat(a, "llama3.2:3b")
    assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] != fqdn("hub-b")
    assert op(a, "GET", "/status")["pins"][0]["targetAvailable"] is False
    op(a, "POST", "/pins", {"scope": "model", "model": "qwen3:8b", "targetKind": "peer", "targetPeerId": b_id})
    r = chat(a, "qwen3:8b")  # only the disabled peer has it: the pin brings nothing back
    assert r.status_code == 502
    assert "a pin only reorders, and is not what caused this" in r.json()["error"]
    op(a, "DELETE", "/pins?scope=model&model=llama3.2:3b")
    assert [p["model"] for p in op(a, "DELETE", "/pins?scope=model&model=qwen3:8b")["pins"]] == []


def test_inbound_off_and_outbound_off(pool):
    nodes, _ = pool
    a, b = nodes["hub-a"], nodes["hub-b"]
    op(b, "PATCH", "/settings", {"poolInboundEnabled": False})
    a.run(a.node.health.poll_once())
    peer = next(p for p in op(a, "GET", "/status")["peers"] if p["nodeFqdn"] == fqdn("hub-b"))
    assert peer["status"] == "connected" and peer["consecutiveFailures"] == 0
    assert peer["lastCapabilities"]["acceptingWork"] is False and peer["lastCapabilities"]["backends"] == []
    assert chat(a, "qwen3:8b").status_code == 502  # b is skipped on the flag
    assert op(b, "GET", "/status")["directions"]["inbound"] == {"enabled": False, "disabledBy": "setting"}
    op(b, "PATCH", "/settings", {"poolInboundEnabled": True})
    a.run(a.node.health.poll_once())
    op(a, "PATCH", "/settings", {"poolOutboundEnabled": False})
    assert chat(a, "qwen3:8b").status_code == 502  # no forward at all
    ids = {m["id"] for m in httpx.get(a.url + "/v1/models").json()["data"]}
    assert "qwen3:8b" not in ids
    status = op(a, "GET", "/status")
    assert status["reason"] == "partially_disabled" and status["routingActive"] is False


def test_master_off_makes_peers_mark_this_node_unreachable(pool):
    nodes, _ = pool
    a, b = nodes["hub-a"], nodes["hub-b"]
    op(b, "PATCH", "/settings", {"poolEnabled": False})
    for _ in range(3):
        a.run(a.node.health.poll_once())
    assert a.node.peers.by_fqdn(fqdn("hub-b")).status == "unreachable"
    op(b, "PATCH", "/settings", {"poolEnabled": True})
    a.run(a.node.health.poll_once())
    assert a.node.peers.by_fqdn(fqdn("hub-b")).status == "connected"  # the pairing was kept


def test_listings_answer_for_the_pool(pool):
    nodes, _ = pool
    a = nodes["hub-a"]
    data = {m["id"]: m for m in httpx.get(a.url + "/v1/models").json()["data"]}
    assert {"llama3.2:3b", "a-only:1b", "qwen3:8b", "c-only:1b"} <= set(data)
    assert data["qwen3:8b"]["owned_by"] == "hub-pool" and data["qwen3:8b"]["created"] == 0
    tags = {m["name"]: m for m in httpx.get(a.url + "/api/tags").json()["models"]}
    assert tags["c-only:1b"]["size"] == 0 and tags["c-only:1b"]["digest"] == ""


def test_show_falls_back_to_a_peer_without_a_routing_row(pool):
    nodes, _ = pool
    a = nodes["hub-a"]
    before = op(a, "GET", "/routing-log")["summary"]["totalRecorded"]
    r = httpx.post(a.url + "/api/show", json={"model": "c-only:1b"})
    assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] == fqdn("hub-c")
    assert op(a, "GET", "/routing-log")["summary"]["totalRecorded"] == before
    assert httpx.post(a.url + "/api/show", json={"model": "nowhere"}).status_code == 404


def test_auto_resolves_across_the_pool(pool):
    nodes, _ = pool
    a = nodes["hub-a"]
    r = chat(a, "auto")
    assert r.status_code == 200
    assert r.headers["x-hub-pool-model"] == "qwen3:8b"  # 8B beats the small local models
    op(a, "PATCH", "/settings", {"inferenceModel": "c-only:1b"})
    assert chat(a, "auto").headers["x-hub-pool-model"] == "c-only:1b"


def _auto_everywhere(node):
    """What auto stands for on a chat, on /api/show and in the handout: they must agree."""
    r = chat(node, "auto")
    assert r.status_code == 200, r.text
    chosen = {r.headers["x-hub-pool-model"],
              httpx.post(node.url + "/api/show", json={"model": "auto"}).headers["x-hub-pool-model"],
              httpx.get(node.url + P + "/handout").json()["model"]}
    assert len(chosen) == 1, chosen
    return chosen.pop()


def test_auto_never_leaves_the_machine_nor_picks_what_cannot_chat(pool):
    """Issue 16.3 and 16.4: an Ollama Cloud tag (gpt-oss:120b-cloud, deepseek-v3.1:671b-cloud) is
    never chosen; an embedding model set as the preferred model is not returned for chat; a model
    of unknown size is not taken for a tiny one; a model withheld here as unservable is not offered."""
    nodes, sims = pool
    a, b = nodes["hub-a"], nodes["hub-b"]
    assert _auto_everywhere(a) == "qwen3:8b"  # not the 671b / 120b cloud tags
    op(a, "PATCH", "/settings", {"inferenceModel": "nomic-embed-text"})
    assert _auto_everywhere(a) == "qwen3:8b"  # the preference is no chat model
    op(b, "PATCH", "/settings", {"poolInboundEnabled": False})  # the only 8B leaves the pool
    a.run(a.node.health.poll_once())
    assert _auto_everywhere(a) == "mystery"  # unknown size ahead of 3B and 1B
    sims["hub-a"].add_fault("error:500", model="mystery", count=2)
    for _ in range(2):
        assert chat(a, "mystery").status_code == 502  # twice: withheld here as unservable
    assert _auto_everywhere(a) == "llama3.2:3b"


def test_a_node_whose_database_was_recreated_is_re_paired_by_the_documented_steps(pool, tmp_path):
    nodes, _ = pool
    a, b = nodes["hub-a"], nodes["hub-b"]
    port, data_dir, environ = b.port, b.env.data_dir, b.environ
    b.stop()
    (data_dir / "hubpool.db").unlink()
    for leftover in data_dir.glob("hubpool.db-*"):
        leftover.unlink()
    (data_dir / "node.secret").unlink()
    nodes["hub-b"] = b = RunningNode(data_dir, environ, sock=bound_socket_on(port)).start()
    a.run(a.node.health.poll_once())
    peer = next(p for p in op(a, "GET", "/status")["peers"] if p["nodeFqdn"] == fqdn("hub-b"))
    assert peer["probeFailure"]["kind"] == "identity_changed" and peer["status"] == "unreachable"
    # the documented order: unpair here, PIN there, pair here, approve there
    op(a, "DELETE", f"/peers/{fqdn('hub-b')}")
    pin = op(b, "POST", "/pairing-pin")["pin"]
    op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-b"), "pin": pin})
    op(b, "POST", f"/peers/{fqdn('hub-a')}/approve")
    a.run(a.node.health.poll_once())
    assert a.node.peers.by_fqdn(fqdn("hub-b")).status == "connected"
    assert chat(a, "qwen3:8b").headers["x-hub-pool-served-by"] == fqdn("hub-b")


def test_a_hang_up_aborts_the_engine_on_the_far_side_of_a_hop(pool):
    nodes, sims = pool
    a = nodes["hub-a"]
    sims["hub-b"].configure(decode_ms_per_token=50)
    with httpx.stream("POST", a.url + "/api/chat", json={"model": "qwen3:8b", "messages": [
            {"role": "user", "content": "long"}], "options": {"num_predict": 300}}, timeout=30) as r:
        assert r.headers["x-hub-pool-served-by"] == fqdn("hub-b")
        next(r.iter_raw())
    deadline = time.monotonic() + 10
    while sims["hub-b"].stats()["aborted"] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sims["hub-b"].stats()["aborted"] >= 1
