"""The split stages end to end: two real nodes on loopback, each with a simulated Ollama,
paired through the real API (spec: "Slot-aware placement", "Prompt ceilings", "Context caps";
protocol.md §4b steps 4–6 and the §5a sections)."""

from __future__ import annotations

import threading
from contextlib import ExitStack

import httpx
import pytest
from harness import fqdn, make_pool
from harness import pair as pair_nodes

from hubpool_sim import SimConfig, SimModel, run_in_thread
from hubpool_sim.testing import wait_until

P = "/api/inference/pool"
MODEL = "llama3.2:3b"
EMBED = "nomic-embed-text"


def op(node, method, path, body=None, expect=200, prefix=P):
    with node.client(headers=node.headers()) as c:
        r = c.request(method, prefix + path, json=body)
    assert expect is None or r.status_code == expect, (r.status_code, r.text)
    return r.json()


def prefer(node, **changes):
    """PATCH /api/inference/preferences: the node's context cap and slot statement."""
    return op(node, "PATCH", "/api/inference/preferences", changes, prefix="")


def chat(node, content="hello", route="/api/chat", **extra):
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "stream": False, **extra}
    return httpx.post(node.url + route, json=body, timeout=60)


def row(node, response):
    rid = response.headers["x-hub-pool-request-id"]
    return next(e for e in op(node, "GET", "/routing-log?limit=500")["entries"] if e["id"] == rid)


def poll(node):
    node.run(node.node.health.poll_once())


def estimate(entry):
    return -(-entry["bodyBytes"] // 4)


@pytest.fixture
def pair(tmp_path):
    """hub-a (Ollama, 2 slots) paired with hub-b (Ollama, 4 slots), both holding llama3.2:3b
    and an embedding model."""
    with ExitStack() as stack:
        models = [SimModel(MODEL), SimModel(EMBED, embedding=True)]
        sims = {
            "hub-a": stack.enter_context(run_in_thread(SimConfig(flavor="ollama", models=list(models), slots=2,
                                                                 decode_ms_per_token=0))),
            "hub-b": stack.enter_context(run_in_thread(SimConfig(flavor="ollama", models=list(models), slots=4,
                                                                 decode_ms_per_token=0))),
        }
        nodes = make_pool(tmp_path, list(sims), per_node={n: {"OLLAMA_URL": s.url} for n, s in sims.items()})
        for n in nodes.values():
            n.start()
        a, b = nodes["hub-a"], nodes["hub-b"]
        pair_nodes(a, b)
        for _ in range(2):  # a second round: the pairing now signs both ways
            for n in nodes.values():
                poll(n)
        yield nodes, sims
        for n in nodes.values():
            if n.thread.is_alive():
                n.stop()


class Burst:
    """Streamed generations from hub-a, each started once the one before it is placed (counted
    in flight), all held open together until :meth:`finish`."""

    def __init__(self, a, num_predict=40):
        self.a, self.num_predict = a, num_predict
        self.got: list[tuple[str, str] | None] = []
        self.failures: list[str] = []
        self.threads: list[threading.Thread] = []

    def _one(self, i: int) -> None:
        try:
            with httpx.stream("POST", self.a.url + "/api/generate", timeout=60, json={
                    "model": MODEL, "prompt": f"burst {i}", "options": {"num_predict": self.num_predict}}) as r:
                self.got[i] = (r.headers["x-hub-pool-served-by"], r.headers["x-hub-pool-request-id"])
                for _ in r.iter_raw():
                    pass
        except Exception as exc:  # noqa: BLE001 - reported by the test thread
            self.failures.append(repr(exc))

    def start(self, n: int) -> Burst:
        load = self.a.node.load
        for _ in range(n):
            i = len(self.threads)
            self.got.append(None)
            t = threading.Thread(target=self._one, args=(i,))
            t.start()
            self.threads.append(t)
            assert wait_until(lambda: load.local + sum(load.forwarded.values()) >= i + 1, timeout=10), f"request {i}"
        return self

    def finish(self) -> list[tuple[str, str]]:
        for t in self.threads:
            t.join(60)
        assert not self.failures, self.failures
        return self.got


def burst(a, n):
    return Burst(a).start(n).finish()


def rows_by_id(node):
    return {e["id"]: e for e in op(node, "GET", "/routing-log?limit=500")["entries"]}


# -- slots ---------------------------------------------------------------------------------

def test_a_burst_on_a_full_two_slot_node_spills_to_a_four_slot_peer(pair):
    nodes, sims = pair
    a, b = nodes["hub-a"], nodes["hub-b"]
    for sim in sims.values():
        sim.configure(decode_ms_per_token=40)
    assert prefer(a, ollamaSlots=2)["ollamaSlots"] == 2
    assert prefer(b, ollamaSlots=4)["ollamaSlots"] == 4
    # a head start of 4 keeps all four at home on queue depth alone (2 in flight < 0 + 4)
    op(a, "PATCH", "/settings", {"poolSlotAwareness": 1, "poolLocalAffinity": 4})
    poll(a)  # hub-a reads hub-b's statement from its snapshot
    assert a.node.peers.by_fqdn(fqdn("hub-b")).last_capabilities["ollamaSlots"] == 4
    placed = burst(a, 4)
    assert [node for node, _ in placed] == ["local", "local", fqdn("hub-b"), fqdn("hub-b")]
    assert sims["hub-a"].stats()["peak_in_flight"] == 2 and sims["hub-b"].stats()["peak_in_flight"] == 2
    rows = rows_by_id(a)
    sections = [rows[rid]["slots"] for _, rid in placed]
    free = {"demoted": [], "overridden": False}
    full = {"demoted": [{"node": "local", "backend": "ollama", "inFlight": 2, "slots": 2}], "overridden": False}
    assert sections == [free, free, full, full]
    for _, rid in placed:
        assert rows[rid]["promptCeiling"] is None and rows[rid]["contextCap"] is None
    inbound = rows_by_id(b)[placed[2][1]]
    assert inbound["direction"] == "inbound" and inbound["slots"] is None  # placement is the entry node's


def test_with_slot_awareness_off_the_same_burst_queues_behind_the_two_slots(pair):
    nodes, sims = pair
    a, b = nodes["hub-a"], nodes["hub-b"]
    sims["hub-a"].configure(decode_ms_per_token=40)
    prefer(a, ollamaSlots=2)
    prefer(b, ollamaSlots=4)
    op(a, "PATCH", "/settings", {"poolLocalAffinity": 4})  # poolSlotAwareness stays 0
    poll(a)
    seen_queue = []
    watcher = threading.Thread(target=lambda: seen_queue.append(
        wait_until(lambda: sims["hub-a"].stats()["queued"] == 2, timeout=10)))
    watcher.start()
    placed = burst(a, 4)
    watcher.join(15)
    assert [node for node, _ in placed] == ["local"] * 4
    assert seen_queue == [True]  # two waited in Ollama's queue while hub-b sat idle
    rows = rows_by_id(a)
    assert all(rows[rid]["slots"] is None for _, rid in placed)


def test_slots_judge_embeddings_too_and_the_row_says_when_a_full_node_served_anyway(pair):
    nodes, sims = pair
    a, b = nodes["hub-a"], nodes["hub-b"]
    prefer(a, ollamaSlots=2)
    prefer(b, ollamaSlots=4)
    op(a, "PATCH", "/settings", {"poolSlotAwareness": 1})
    poll(a)
    r = httpx.post(a.url + "/api/embed", json={"model": EMBED, "input": ["one", "two"]}, timeout=60)
    assert r.status_code == 200, r.text
    entry = row(a, r)
    assert entry["slots"] == {"demoted": [], "overridden": False}
    assert entry["promptCeiling"] is None and entry["contextCap"] is None  # embeddings are not judged for those
    # hub-a full (two held open), and hub-b's engine refusing: failover reaches the full node
    sims["hub-a"].configure(decode_ms_per_token=40)
    held = Burst(a).start(2)
    try:
        sims["hub-b"].add_fault("error:503", count=1)
        r = chat(a)
        assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] == "local"
        entry = row(a, r)
        assert entry["failedOverFrom"] == [fqdn("hub-b")]
        assert entry["slots"] == {"demoted": [{"node": "local", "backend": "ollama", "inFlight": 2, "slots": 2}],
                                  "overridden": True}
    finally:
        assert [node for node, _ in held.finish()] == ["local", "local"]


# -- prompt ceilings -------------------------------------------------------------------------

def test_a_long_prompt_skips_a_node_whose_ceiling_is_below_its_estimate(pair):
    nodes, sims = pair
    a, b = nodes["hub-a"], nodes["hub-b"]
    assert op(a, "PATCH", "/settings", {"poolMaxPromptTokens": 1024})["poolMaxPromptTokens"] == 1024
    long = "word " * 1200  # ~6 KB: about 1,500 tokens by bytes / 4

    r = chat(a, long)
    assert r.status_code == 200, r.text
    assert r.headers["x-hub-pool-served-by"] == fqdn("hub-b")
    entry = row(a, r)
    assert estimate(entry) > 1024
    assert entry["promptCeiling"] == {"estimatedTokens": estimate(entry),
                                      "excluded": [{"node": "local", "maxPromptTokens": 1024}], "overridden": False}
    assert entry["contextCap"] is None and entry["slots"] is None

    short = chat(a, "hello")  # under the ceiling: the ranker's choice stands, and the row says so
    assert short.headers["x-hub-pool-served-by"] == "local"
    entry = row(a, short)
    assert entry["promptCeiling"] == {"estimatedTokens": estimate(entry), "excluded": [], "overridden": False}

    # a pin at the over-ceiling node reorders within its group only: the long prompt still leaves
    op(a, "POST", "/pins", {"scope": "default", "targetKind": "local"})
    r = chat(a, long)
    assert r.headers["x-hub-pool-served-by"] == fqdn("hub-b")
    assert row(a, r)["pin"] == {"scope": "default", "mode": "prefer", "targetKind": "local"}
    assert chat(a, "hello").headers["x-hub-pool-served-by"] == "local"
    op(a, "DELETE", "/pins?scope=default")

    # never refused: when hub-b fails, the over-ceiling node serves it, and the row says overridden
    sims["hub-b"].add_fault("error:503", count=1)
    r = chat(a, long)
    assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] == "local"
    entry = row(a, r)
    assert entry["failedOverFrom"] == [fqdn("hub-b")]
    assert entry["promptCeiling"]["overridden"] is True


def test_a_peers_advertised_ceiling_and_every_node_over_moves_nothing(pair):
    nodes, _ = pair
    a, b = nodes["hub-a"], nodes["hub-b"]
    op(b, "PATCH", "/settings", {"poolMaxPromptTokens": 1024})
    poll(a)
    long = "word " * 1200
    # the peer over its ceiling, pinned: the pin cannot bring it back in front of hub-a
    op(a, "POST", "/pins", {"scope": "default", "targetKind": "peer",
                            "targetPeerId": a.node.peers.by_fqdn(fqdn("hub-b")).id})
    r = chat(a, long)
    assert r.headers["x-hub-pool-served-by"] == "local"
    entry = row(a, r)
    assert entry["promptCeiling"]["excluded"] == [{"node": fqdn("hub-b"), "maxPromptTokens": 1024}]
    op(a, "DELETE", "/pins?scope=default")
    # both over: nothing moves, nothing is refused
    op(a, "PATCH", "/settings", {"poolMaxPromptTokens": 1024})
    r = chat(a, long)
    assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] == "local"
    entry = row(a, r)
    assert entry["promptCeiling"] == {"estimatedTokens": estimate(entry), "excluded": [], "overridden": False}


# -- context caps ------------------------------------------------------------------------------

def test_a_native_num_ctx_above_a_nodes_cap_goes_to_an_uncapped_peer(pair):
    nodes, _ = pair
    a, b = nodes["hub-a"], nodes["hub-b"]
    assert prefer(a, maxNumCtx=8192)["maxNumCtx"] == 8192

    r = chat(a, options={"num_ctx": 16384})
    assert r.status_code == 200, r.text
    assert r.headers["x-hub-pool-served-by"] == fqdn("hub-b")
    entry = row(a, r)
    assert entry["contextCap"] == {"numCtx": 16384, "source": "request",
                                   "excluded": [{"node": "local", "maxNumCtx": 8192}], "overridden": False}
    assert entry["promptCeiling"] is None and entry["slots"] is None

    r = chat(a, options={"num_ctx": 8192})  # at the cap is not above it
    assert r.headers["x-hub-pool-served-by"] == "local"
    assert row(a, r)["contextCap"] == {"numCtx": 8192, "source": "request", "excluded": [], "overridden": False}

    # the OpenAI dialect carries no num_ctx: the prompt estimate stands in for the window
    r = httpx.post(a.url + "/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "stream": False})
    assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] == "local"
    entry = row(a, r)
    assert entry["contextCap"] == {"numCtx": estimate(entry), "source": "estimated", "excluded": [],
                                   "overridden": False}
    # options.num_ctx on a /v1 body is not read at all
    r = chat(a, route="/v1/chat/completions", options={"num_ctx": 16384})
    assert r.headers["x-hub-pool-served-by"] == "local" and row(a, r)["contextCap"]["source"] == "estimated"


def test_a_pin_at_a_capped_peer_cannot_bring_a_large_window_back(pair):
    nodes, sims = pair
    a, b = nodes["hub-a"], nodes["hub-b"]
    prefer(b, maxNumCtx=8192)
    poll(a)
    op(a, "POST", "/pins", {"scope": "default", "targetKind": "peer",
                            "targetPeerId": a.node.peers.by_fqdn(fqdn("hub-b")).id})
    r = chat(a, options={"num_ctx": 32768})
    assert r.headers["x-hub-pool-served-by"] == "local"
    entry = row(a, r)
    assert entry["contextCap"] == {"numCtx": 32768, "source": "request",
                                   "excluded": [{"node": fqdn("hub-b"), "maxNumCtx": 8192}], "overridden": False}
    assert entry["pin"] == {"scope": "default", "mode": "prefer", "targetKind": "peer"}
    # a window the cap takes: the pin is what it always was
    assert chat(a, options={"num_ctx": 4096}).headers["x-hub-pool-served-by"] == fqdn("hub-b")
    # the cap outranks the ceiling: hub-a over its ceiling still beats a peer capped below the window
    op(a, "PATCH", "/settings", {"poolMaxPromptTokens": 1024})
    r = chat(a, "word " * 1200, options={"num_ctx": 32768})
    assert r.headers["x-hub-pool-served-by"] == "local"
    entry = row(a, r)
    assert entry["contextCap"]["excluded"] == [{"node": fqdn("hub-b"), "maxNumCtx": 8192}]
    assert entry["promptCeiling"]["excluded"] == []  # nobody in hub-a's cap group to move behind
    # hub-a's engine failing reaches the capped peer: the cap's demotion was overridden
    sims["hub-a"].add_fault("error:503", count=1)
    r = chat(a, options={"num_ctx": 32768})
    assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] == fqdn("hub-b")
    assert row(a, r)["contextCap"]["overridden"] is True
