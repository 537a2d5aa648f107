"""Issue 27 item 4 through three running nodes (docs/placement.md): a model resident on one
node goes there while its queue is short, and to a node that must load it only when the load
beats that queue — with the spec's stages (slot awareness) and with the admission queue on;
and the admission queue's first-token target (``poolAdmissionTargetMs``): a waiter that can
still make it takes a freed slot before one that already cannot.

Engines are simulators on the wall clock: per node a llama-server-shaped engine for the chat
model (each node times its own, so every node has a measured speed) and an Ollama-shaped one
for the cold model, resident on hub-b only, 2 s to load elsewhere."""

from __future__ import annotations

import threading
from contextlib import ExitStack

import httpx
import pytest
from harness import fqdn, make_pool, meshed, wait_until

from hubpool_sim import SimConfig, SimModel, run_in_thread

P = "/api/inference/pool"
MODEL = "chat:8b"
COLD = "cold:1b"
NAMES = ["hub-a", "hub-b", "hub-c"]
TOKEN_MS = 10


def op(node, method, path, body=None, expect=200):
    with node.client(headers=node.headers()) as c:
        r = c.request(method, P + path, json=body)
    assert expect is None or r.status_code == expect, (r.status_code, r.text)
    return r.json()


def cold(node, tokens=1, timeout=60):
    """A native streamed chat for the cold model: Ollama's timings come back on its final frame
    (and a stream's first byte times a load)."""
    r = httpx.post(node.url + "/api/chat", timeout=timeout, trust_env=False, json={
        "model": COLD, "stream": True, "options": {"num_predict": tokens},
        "messages": [{"role": "user", "content": "x" * 800}]})
    assert r.status_code == 200, r.text
    return r


def chat(node, tokens=1, content="hello", timeout=60):
    r = httpx.post(node.url + "/v1/chat/completions", timeout=timeout, trust_env=False, json={
        "model": MODEL, "max_tokens": tokens, "messages": [{"role": "user", "content": content}]})
    assert r.status_code == 200, r.text
    return r


def served(response, entry="hub-a"):
    by = response.headers["x-hub-pool-served-by"]
    return entry if by == "local" else by.split(".", 1)[0]


def row(node, response):
    rid = response.headers["x-hub-pool-request-id"]
    return next(e for e in op(node, "GET", "/routing-log?limit=500")["entries"] if e["id"] == rid)


def predictions(node, response):
    return {("hub-a" if p["node"] == "local" else p["node"].split(".", 1)[0]): p
            for p in row(node, response)["ttft"]["predictions"]}


@pytest.fixture
def pool(tmp_path):
    with ExitStack() as stack:
        def sim(**kw):
            return stack.enter_context(run_in_thread(SimConfig(**kw)))

        chats = {n: sim(flavor="llamacpp", slots=2, prefill_tps=2000, decode_ms_per_token=TOKEN_MS, timings=True,
                        name=n, models=[SimModel(MODEL, window=65536)]) for n in NAMES}
        # hub-c's copy unloads a second after each answer (Ollama's keep_alive), so a load there
        # can be measured and still be owed the next time
        colds = {n: sim(flavor="ollama", slots=2, prefill_tps=2000, decode_ms_per_token=TOKEN_MS, load_ms=2000,
                        keep_alive_s=1.0 if n == "hub-c" else 3600.0, name=n, models=[SimModel(COLD)],
                        preloaded=[COLD] if n == "hub-b" else []) for n in NAMES}
        nodes = make_pool(tmp_path, NAMES, environ={"HUB_POOL_DEV_HEALTH_POLL_SECONDS": "1"},
                          per_node={n: {"LLAMACPP_URL": chats[n].url, "OLLAMA_URL": colds[n].url} for n in NAMES})
        a, b, c = meshed(stack, nodes, [MODEL, COLD])
        for name, n in nodes.items():  # each node times its own engine: a speed every node advertises
            assert served(chat(n, content="warm " * 300), name) == name
        for n in (a, b, c):
            n.run(n.node.residency_sampler.sample())
        for n in (a, b, c):
            n.run(n.node.health.poll_once())
        # the first request for the cold model goes to the one node holding it, and hub-a times
        # its service there (3 s: 300 tokens)
        assert served(cold(a, 300)) == "hub-b"
        yield nodes, colds


class Holders:
    """Requests a node's own app keeps in flight on its cold engine (pinned there)."""

    def __init__(self, node, sim, count, tokens):
        op(node, "POST", "/pins", {"scope": "default", "targetKind": "local"})
        self.threads = [threading.Thread(target=cold, args=(node, tokens)) for _ in range(count)]
        for t in self.threads:
            t.start()
        assert wait_until(lambda: sim.stats()["in_flight"] == count, timeout=20)
        op(node, "DELETE", "/pins?scope=default")

    def join(self):
        for t in self.threads:
            t.join(60)


def behind_two(a, b, colds):
    """hub-a's request for the cold model while hub-b's own app has two 6 s requests in flight
    on its cold engine (hub-a has polled them), answered in full."""
    held = Holders(b, colds["hub-b"], 2, 600)
    try:
        a.run(a.node.health.poll_once())
        return cold(a)
    finally:
        held.join()


def test_a_warm_nodes_short_queue_beats_a_load_and_a_load_beats_a_long_one(pool):
    nodes, colds = pool
    a, b, c = (nodes[n] for n in NAMES)
    # untouched settings: hub-b's Ollama states no slot count; two requests in flight there
    r = behind_two(a, b, colds)
    # priced as one slot, hub-b's two requests ahead wait two service times (~6 s), against
    # a 30 s load anywhere else (never measured): the request waits at the warm node
    assert served(r) == "hub-b"
    by = predictions(a, r)
    assert by["hub-b"]["waitMs"] > 0 and by["hub-b"]["slots"] is None and by["hub-b"]["loadMs"] == 0
    assert by["hub-a"]["loadMs"] > 0 and by["hub-c"]["loadMs"] > 0
    # hub-c loads it once (a pin): hub-c times the load and advertises it; it unloads a second later
    op(a, "POST", "/pins", {"scope": "default", "targetKind": "peer",
                            "targetPeerId": a.node.peers.by_fqdn(fqdn("hub-c")).id})
    assert served(cold(a)) == "hub-c"
    op(a, "DELETE", "/pins?scope=default")

    def hub_c_cold():
        c.run(c.node.residency_sampler.sample())
        a.run(a.node.health.poll_once())
        caps = next(p for p in op(a, "GET", "/status")["peers"] if p["nodeFqdn"] == fqdn("hub-c"))["lastCapabilities"]
        load = next((s.get("loadMs") for s in caps.get("speed", []) if s["model"] == COLD), None)
        return {"backend": "ollama", "models": []} in caps.get("resident", []) and load and 1500 <= load < 6000

    assert wait_until(hub_c_cold, timeout=20)
    r = behind_two(a, b, colds)
    # now a load (~2 s) beats hub-b's queue (~6 s): the request goes where it must load
    assert served(r) == "hub-c"
    by = predictions(a, r)
    assert by["hub-c"]["loadMs"] > 0 and by["hub-c"]["predictedMs"] < by["hub-b"]["predictedMs"]


def test_slot_awareness_and_the_admission_queue_wait_for_the_warm_node(pool):
    nodes, colds = pool
    a, b, c = (nodes[n] for n in NAMES)
    for n in (a, b, c):  # as the docs say: each node states its Ollama's slots, slot awareness on
        with n.client(headers=n.headers()) as client:
            assert client.patch("/api/inference/preferences", json={"ollamaSlots": 2}).status_code == 200
        op(n, "PATCH", "/settings", {"poolSlotAwareness": 1})
    for n in (a, b, c):
        n.run(n.node.health.poll_once())
    r = behind_two(a, b, colds)
    # hub-b is full (2 of 2), and the spec's slot split would move it behind the idle nodes;
    # its predicted wait (one service time over two slots) beats their 30 s load: it stays first
    assert served(r) == "hub-b"
    kept = row(a, r)["slots"]["kept"]
    assert [k["node"].split(".", 1)[0] for k in kept] == ["hub-b"] and kept[0]["inFlight"] == 2
    # the admission queue on: hub-a holds the request instead of over-committing hub-b, and sends
    # it there when a slot frees (the busy load poll tells hub-a, whose request waits)
    op(a, "PATCH", "/settings", {"poolAdmissionQueue": 4})
    r = behind_two(a, b, colds)
    assert served(r) == "hub-b"
    assert int(r.headers["x-hub-pool-queued-ms"]) > 0
    assert not colds["hub-a"].stats()["by_model"] and not colds["hub-c"].stats()["by_model"]  # nothing loaded


# -- the admission queue's first-token target -----------------------------------------------

class Stream:
    """A streamed chat an app holds open until told to hang up: the node's slot stays taken."""

    def __init__(self, node):
        self.ready, self.stop = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, args=(node,))
        self.thread.start()
        assert self.ready.wait(20)

    def _run(self, node):
        with httpx.stream("POST", node.url + "/v1/chat/completions", timeout=60, trust_env=False, json={
                "model": MODEL, "max_tokens": 3000, "stream": True,
                "messages": [{"role": "user", "content": "hold"}]}) as r:
            for _ in r.iter_lines():
                self.ready.set()
                if self.stop.is_set():
                    return

    def hang_up(self):
        self.stop.set()
        self.thread.join(30)


@pytest.fixture
def one_slot_pool(tmp_path):
    with ExitStack() as stack:
        sims = {n: stack.enter_context(run_in_thread(SimConfig(
            flavor="llamacpp", slots=1, prefill_tps=2000, decode_ms_per_token=TOKEN_MS, timings=True, name=n,
            models=[SimModel(MODEL, window=65536)]))) for n in NAMES}
        nodes = make_pool(tmp_path, NAMES, environ={"HUB_POOL_DEV_HEALTH_POLL_SECONDS": "1",
                                                    "HUB_POOL_DEV_LOAD_POLL_MS": "100"},
                          per_node={n: {"LLAMACPP_URL": sims[n].url} for n in NAMES})
        a, b, c = meshed(stack, nodes, [MODEL])
        for name, n in nodes.items():
            assert served(chat(n, content="warm " * 300), name) == name
        for n in (a, b, c):
            n.run(n.node.health.poll_once())
        yield nodes, sims


def dispatched(node, response):
    """When the queue let the request go: its row's arrival plus the time it waited."""
    from datetime import datetime

    entry = row(node, response)
    return datetime.fromisoformat(entry["at"].replace("Z", "+00:00")).timestamp() + entry["queuedMs"] / 1000


def test_a_waiter_that_can_still_make_the_target_takes_the_freed_slot_first(one_slot_pool):
    nodes, sims = one_slot_pool
    a = nodes["hub-a"]
    op(a, "PATCH", "/settings", {"poolAdmissionQueue": 4, "poolAdmissionTargetMs": 1000})
    held = {}
    for name, n in nodes.items():  # every node's own app takes its only slot
        op(n, "POST", "/pins", {"scope": "default", "targetKind": "local"})
        held[name] = Stream(n)
        op(n, "DELETE", "/pins?scope=default")
    answers = {}

    def send(label):
        answers[label] = chat(a)

    old = threading.Thread(target=send, args=("old",))
    new = threading.Thread(target=send, args=("new",))
    try:
        a.run(a.node.health.poll_once())
        old.start()
        # the first waits until it has waited past the target: it can no longer make it
        assert wait_until(lambda: op(a, "GET", "/status")["admission"]["oldestWaitMs"] >= 1200, timeout=20)
        new.start()
        assert wait_until(lambda: op(a, "GET", "/status")["admission"]["queued"] == 2, timeout=20)
        held["hub-c"].hang_up()  # one slot frees: the one that can still make it takes it
        new.join(30)
        old.join(30)  # then the late one, as soon as that slot frees again: nothing lost
        assert served(answers["new"]) == "hub-c" and served(answers["old"]) == "hub-c"
        assert dispatched(a, answers["new"]) < dispatched(a, answers["old"])
    finally:
        for s in held.values():
            s.hang_up()
        old.join(30)
        new.join(30)
