"""Prefix affinity and local engine contention end to end: two real nodes on loopback, each
with a simulated Ollama, paired through the real API (spec: "Prefix affinity", "Local
engine contention")."""

from __future__ import annotations

import json
import socket
import threading
from contextlib import ExitStack

import httpx
import pytest
from harness import fqdn, make_pool, wait_until
from harness import pair as pair_nodes

from hubpool_sim import SimConfig, SimModel, run_in_thread

P = "/api/inference/pool"
MODEL = "llama3.2:3b"
SYSTEM = {"role": "system", "content": "You are a coding agent. " + "Follow the tool protocol. " * 400}


def op(node, method, path, body=None, expect=200):
    with node.client(headers=node.headers()) as c:
        r = c.request(method, P + path, json=body)
    assert expect is None or r.status_code == expect, (r.status_code, r.text)
    return r.json()


def chat(node, messages, session=None, model=MODEL):
    headers = {"X-Hub-Pool-Session": session} if session else {}
    return httpx.post(node.url + "/api/chat", json={"model": model, "messages": messages, "stream": False},
                      headers=headers, timeout=60)


def row(node, response):
    rid = response.headers["x-hub-pool-request-id"]
    return next(e for e in op(node, "GET", "/routing-log?limit=500")["entries"] if e["id"] == rid)


def poll_all(nodes):
    for n in nodes.values():
        n.run(n.node.health.poll_once())


@pytest.fixture
def pair(tmp_path):
    """hub-a (Ollama: llama3.2:3b, a-only:1b) paired with hub-b (Ollama: llama3.2:3b)."""
    with ExitStack() as stack:
        sims = {
            "hub-a": stack.enter_context(run_in_thread(SimConfig(flavor="ollama", models=[
                SimModel(MODEL), SimModel("a-only:1b")], decode_ms_per_token=0))),
            "hub-b": stack.enter_context(run_in_thread(SimConfig(flavor="ollama", models=[SimModel(MODEL)],
                                                                 decode_ms_per_token=0))),
        }
        nodes = make_pool(tmp_path, list(sims), per_node={n: {"OLLAMA_URL": s.url} for n, s in sims.items()})
        for n in nodes.values():
            n.start()
        a, b = nodes["hub-a"], nodes["hub-b"]
        pair_nodes(a, b)
        poll_all(nodes)
        poll_all(nodes)  # a second round: the pairing now signs both ways
        yield nodes, sims
        for n in nodes.values():
            if n.thread.is_alive():
                n.stop()


def pin_to(a, name):
    op(a, "POST", "/pins", {"scope": "default", "targetKind": "peer",
                            "targetPeerId": a.node.peers.by_fqdn(fqdn(name)).id})


def test_a_named_session_follows_to_the_node_it_last_ran_on(pair):
    nodes, _ = pair
    a = nodes["hub-a"]
    margin = op(a, "PATCH", "/settings", {"poolPrefixAffinityMaxInFlight": 2})["poolPrefixAffinityMargin"]
    turn = [{"role": "user", "content": "hello"}]
    pin_to(a, "hub-b")  # the first call goes to the peer, as a pin or a busy queue once sent it
    first = chat(a, turn, session="agent-run-1")
    assert first.status_code == 200, first.text
    assert first.headers["x-hub-pool-served-by"] == fqdn("hub-b")
    assert first.headers["x-hub-pool-affinity"] == "miss"
    assert row(a, first)["affinity"] == {"key": "header", "keySource": "X-Hub-Pool-Session", "outcome": "miss", "qualified": False, "remembered": None,
                                         "inFlight": None, "leastLoadedInFlight": None, "maxInFlight": 2,
                                         "affinityMargin": margin}
    op(a, "DELETE", "/pins?scope=default")
    control = chat(a, turn, session="agent-run-2")  # another session: the ranker keeps it home
    assert control.headers["x-hub-pool-served-by"] == "local"
    assert control.headers["x-hub-pool-affinity"] == "miss"
    second = chat(a, turn + [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "again"}],
                  session="agent-run-1")
    assert second.status_code == 200, second.text
    assert second.headers["x-hub-pool-served-by"] == fqdn("hub-b")
    assert second.headers["x-hub-pool-affinity"] == "hit"
    section = row(a, second)["affinity"]
    assert section == {"key": "header", "keySource": "X-Hub-Pool-Session", "outcome": "hit", "qualified": True,
                       "remembered": fqdn("hub-b"),
                       "inFlight": 0, "leastLoadedInFlight": 0, "maxInFlight": 2, "affinityMargin": margin}
    assert "agent-run-1" not in str(row(a, second))  # the key is never logged


def test_a_session_without_the_header_is_named_by_its_prompt_head(pair):
    nodes, _ = pair
    a = nodes["hub-a"]
    op(a, "PATCH", "/settings", {"poolPrefixAffinityMaxInFlight": 2})
    pin_to(a, "hub-b")
    first_turn = [SYSTEM, {"role": "user", "content": "task 1: fix the build"}]
    assert chat(a, first_turn, session="not a valid id!").headers["x-hub-pool-served-by"] == fqdn("hub-b")
    op(a, "DELETE", "/pins?scope=default")
    grown = first_turn + [{"role": "assistant", "content": "on it"}, {"role": "user", "content": "go on"}]
    r = chat(a, grown)
    assert r.headers["x-hub-pool-served-by"] == fqdn("hub-b") and r.headers["x-hub-pool-affinity"] == "hit"
    assert row(a, r)["affinity"]["key"] == "hashed"
    other = chat(a, [SYSTEM, {"role": "user", "content": "task 2: write the docs"}])  # same system prompt
    assert other.headers["x-hub-pool-served-by"] == "local" and other.headers["x-hub-pool-affinity"] == "miss"


def test_affinity_off_adds_no_header_and_no_section(pair):
    nodes, _ = pair
    a = nodes["hub-a"]
    r = chat(a, [{"role": "user", "content": "hello"}], session="agent-run-1")
    assert r.status_code == 200 and "x-hub-pool-affinity" not in r.headers
    assert row(a, r)["affinity"] is None


def test_a_local_engine_busy_with_another_model_gives_way_to_the_idle_peer(pair, monkeypatch):
    # spec: beta-max 2026-09-26, a turn placed beside another model's generation sat out its budget
    nodes, sims = pair
    a = nodes["hub-a"]
    sims["hub-a"].configure(decode_ms_per_token=100)
    started, done = threading.Event(), threading.Event()

    def other_model_turn():
        with httpx.stream("POST", a.url + "/api/generate", json={"model": "a-only:1b", "prompt": "x",
                                                                  "options": {"num_predict": 40}}, timeout=60) as r:
            assert r.headers["x-hub-pool-served-by"] == "local"
            started.set()
            for _ in r.iter_raw():
                pass
        done.set()

    worker = threading.Thread(target=other_model_turn)
    worker.start()
    try:
        assert started.wait(10)
        # local 1 in flight ties the peer's 0 + the head start of 1: without contention local takes it
        r = chat(a, [{"role": "user", "content": "hello"}])
        assert r.headers["x-hub-pool-served-by"] == fqdn("hub-b")
        section = row(a, r)["contention"]
        assert section["overridden"] is False
        assert section["demoted"] == [{"node": "local", "backend": "ollama",
                                       "busyWith": [{"model": "a-only:1b", "numCtx": None}], "runsAt": None,
                                       "behind": [fqdn("hub-b")], "overriddenBy": None}]
        monkeypatch.setenv("HUB_POOL_CONTENTION_PLACEMENT", "off")  # read per request
        r = chat(a, [{"role": "user", "content": "hello"}])
        assert r.headers["x-hub-pool-served-by"] == "local" and row(a, r)["contention"] is None
    finally:
        worker.join(60)
    assert done.is_set()


def test_an_embedding_in_flight_is_no_contention(tmp_path):
    """Issue 26.15: a chat gave up its local head start because the engine was embedding; the
    spec's contention counts only generations. The local engine busy with another model's
    embedding keeps its place; its generation still makes it give way."""
    with ExitStack() as stack:
        sims = {
            "hub-a": stack.enter_context(run_in_thread(SimConfig(flavor="ollama", models=[
                SimModel(MODEL), SimModel("nomic-embed-text", embedding=True)], decode_ms_per_token=0))),
            "hub-b": stack.enter_context(run_in_thread(SimConfig(flavor="ollama", models=[SimModel(MODEL)],
                                                                 decode_ms_per_token=0))),
        }
        nodes = make_pool(tmp_path, list(sims), per_node={n: {"OLLAMA_URL": s.url} for n, s in sims.items()})
        for n in nodes.values():
            stack.enter_context(n)
        a = nodes["hub-a"]
        pair_nodes(a, nodes["hub-b"])
        poll_all(nodes)
        sims["hub-a"].add_fault("hang", model="nomic-embed-text", count=1)  # an embedding that takes its time
        body = json.dumps({"model": "nomic-embed-text", "input": "a long document"})
        embedding = socket.create_connection(("127.0.0.1", a.port))
        stack.callback(embedding.close)
        embedding.sendall(f"POST /api/embed HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
        assert wait_until(lambda: a.node.load.local == 1)
        # local 1 in flight ties the peer's 0 + the head start of 1: it keeps it, nothing contends
        r = chat(a, [{"role": "user", "content": "hello"}])
        assert r.status_code == 200, r.text
        assert row(a, r)["contention"] is None, row(a, r)["contention"]
        assert r.headers["x-hub-pool-served-by"] == "local"
        embedding.close()
        assert wait_until(lambda: a.node.load.local == 0)
