"""The pool-wide admission queue (poolAdmissionQueue) through two running nodes, each beside
a one-slot llama-server-shaped simulator that reports its slot count: a saturated pool
queues instead of over-committing, dispatches to the node that frees first, honours priority
and the deadline, refuses overflow with 429 + Retry-After, loses nothing when a queued app
hangs up, and with the setting off places exactly as before."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from contextlib import ExitStack

import httpx
import pytest
from aiohttp import web
from aiohttp_thread import ThreadedApp
from harness import RunningNode, fqdn, make_pool, poll_until_offered
from harness import pair as pair_nodes

from hubpool_sim import SimConfig, SimModel, run_in_thread

P = "/api/inference/pool"
MODEL = "chat:8b"


def op(node, method, path, body=None, expect=200):
    with node.client(headers=node.headers()) as c:
        r = c.request(method, P + path, json=body)
    assert expect is None or r.status_code == expect, (r.status_code, r.text)
    return r.json()


def ask(node, tokens=1, route="/v1/chat/completions", key=None, timeout=30, stream=False):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "stream": stream}
    if route == "/api/chat":
        body["options"] = {"num_predict": tokens}
        body["stream"] = False
    else:
        body["max_tokens"] = tokens
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(node.url + route, json=body, headers=headers, timeout=timeout)


def row(node, rid):
    return next(e for e in op(node, "GET", "/routing-log?limit=500")["entries"] if e["id"] == rid)


def until(predicate, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


class Background:
    """Requests sent from threads; each result kept with when its answer arrived."""

    def __init__(self):
        self.threads, self.results = [], {}

    def send(self, name, *args, **kwargs):
        def run():
            try:
                r = ask(*args, **kwargs)
                self.results[name] = (r, time.monotonic())
            except httpx.HTTPError as exc:
                self.results[name] = (exc, time.monotonic())
        t = threading.Thread(target=run)
        t.start()
        self.threads.append(t)

    def join(self):
        for t in self.threads:
            t.join(60)


@pytest.fixture
def pool(tmp_path):
    with ExitStack() as stack:
        sims = {name: stack.enter_context(run_in_thread(SimConfig(
            flavor="llamacpp", slots=1, decode_ms_per_token=10, timings=True, name=name,
            models=[SimModel(MODEL, window=8192)]))) for name in ("hub-a", "hub-b")}
        env = {"HUB_POOL_DEV_HEALTH_POLL_SECONDS": "1", "HUB_POOL_DEV_FIRST_BYTE_FLOOR_MS": "1000",
               "HUB_POOL_FIRST_BYTE_TIMEOUT_MS": "2500", "HUB_POOL_COMPLETION_TIMEOUT_MS": "20000"}
        nodes = make_pool(tmp_path, list(sims), environ=env,
                          per_node={n: {"LLAMACPP_URL": s.url} for n, s in sims.items()})
        for n in nodes.values():
            n.start()
        a, b = nodes["hub-a"], nodes["hub-b"]
        pair_nodes(a, b)
        poll_until_offered(a, [b], MODEL)
        op(a, "PATCH", "/settings", {"poolAdmissionQueue": 4})
        yield a, b, sims
        for n in nodes.values():
            n.stop()


def hold_both(a, bg, long_a=200, long_b=100):
    """One request on each node's only slot (the second goes to the free node, not behind the first)."""
    bg.send("hold-1", a, long_a, stream=True)
    until(lambda: a.node.load.local + sum(a.node.load.forwarded.values()) == 1)
    bg.send("hold-2", a, long_b, stream=True)
    until(lambda: a.node.load.local == 1 and sum(a.node.load.forwarded.values()) == 1)


def test_a_saturated_pool_queues_and_dispatches_to_the_node_that_frees_first(pool):
    a, b, sims = pool
    bg = Background()
    hold_both(a, bg, long_a=250, long_b=60)  # hub-b's slot frees first
    r = ask(a, 1)
    assert r.status_code == 200, r.text
    waited = int(r.headers["x-hub-pool-queued-ms"])
    assert waited >= 200
    # hub-b's slot frees at ~0.6 s, hub-a's at ~2.5 s: the queued request goes where a slot freed first
    assert r.headers["x-hub-pool-served-by"] == fqdn("hub-b")
    assert row(a, r.headers["x-hub-pool-request-id"])["queuedMs"] == waited
    bg.join()
    assert all(res.status_code == 200 for res, _ in bg.results.values())
    # never over-committed: each engine ran one request at a time, nothing waited inside one
    assert sims["hub-a"].stats()["peak_in_flight"] == 1 and sims["hub-b"].stats()["peak_in_flight"] == 1
    status = op(a, "GET", "/status")["admission"]
    assert status["enabled"] and status["queued"] == 0 and status["dispatched"] >= 1


def test_interactive_goes_before_batch_and_overflow_is_refused(pool):
    a, _, _ = pool
    _, batch_key = a.node.keys.create("nightly-batch", "inference")
    batch_id = a.node.keys.resolve(batch_key).key_id
    _, app_key = a.node.keys.create("chat-app", "inference")
    op(a, "PATCH", "/settings", {"poolAdmissionQueue": 2, "poolAdmissionBatchKeys": [batch_id]})
    bg = Background()
    hold_both(a, bg, long_a=400, long_b=400)  # long enough for a loaded box to queue three behind them
    bg.send("batch", a, 1, key=batch_key)
    until(lambda: a.node.admission.status()["batch"] == 1)
    bg.send("interactive", a, 1, key=app_key)
    until(lambda: a.node.admission.status()["interactive"] == 1)
    over = ask(a, 1, key=app_key)  # a third waiter: the queue holds two
    assert over.status_code == 429 and int(over.headers["retry-after"]) >= 1
    assert over.json()["error"]["type"] == "rate_limit_error"
    assert row(a, over.headers["x-hub-pool-request-id"])["status"] == 429
    native = ask(a, 1, route="/api/chat")
    assert native.status_code == 429 and isinstance(native.json()["error"], str)  # Ollama's shape
    bg.join()
    (inter, inter_at), (batch, batch_at) = bg.results["interactive"], bg.results["batch"]
    assert inter.status_code == batch.status_code == 200
    assert inter_at < batch_at  # the interactive one took the first free slot, though it came second
    assert int(inter.headers["x-hub-pool-queued-ms"]) < int(batch.headers["x-hub-pool-queued-ms"])


def test_a_wait_past_the_budget_is_a_503_and_a_hang_up_loses_nothing(pool):
    a, _, sims = pool
    bg = Background()
    hold_both(a, bg, long_a=400, long_b=400)
    late = ask(a, 1, stream=True)  # a stream's budget is 2.5 s here; both slots stay busy for 4 s
    assert late.status_code == 503 and int(late.headers["retry-after"]) >= 1
    entry = row(a, late.headers["x-hub-pool-request-id"])
    assert entry["outcome"] == "failed" and entry["queuedMs"] >= 2400 and "budget" in entry["reason"]
    with pytest.raises(httpx.ReadTimeout):
        ask(a, 1, timeout=0.4)
    assert until(lambda: a.node.admission.status()["queued"] == 0)
    gone = [e for e in op(a, "GET", "/routing-log?limit=50")["entries"] if e["clientClosed"]]
    # it waited until the app gave up (0.4 s after sending; the node saw it arrive later than that)
    assert gone and gone[0]["queuedMs"] >= 100 and "admission queue" in gone[0]["reason"]
    assert gone[0]["node"] is None  # no node was ever asked
    bg.join()
    assert all(res.status_code == 200 for res, _ in bg.results.values())  # the others were not touched
    assert sims["hub-a"].stats()["completed"] >= 1 and a.node.admission.status()["abandoned"] == 1


def test_a_streamed_request_gets_keep_alives_while_it_waits(pool, monkeypatch):
    from hubpool_core.api import admission

    monkeypatch.setattr(admission, "KEEPALIVE_AFTER_S", 0.2)
    monkeypatch.setattr(admission, "KEEPALIVE_EVERY_S", 0.2)
    a, _, _ = pool
    bg = Background()
    hold_both(a, bg, long_a=120, long_b=120)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 3}
    with httpx.stream("POST", a.url + "/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        text = "".join(r.iter_text())
    assert text.startswith(": queued\n\n")  # comments first, while it waited
    assert "tok0" in text and text.rstrip().endswith("data: [DONE]")
    bg.join()


def test_with_the_setting_off_nothing_queues(pool):
    a, _, sims = pool
    op(a, "PATCH", "/settings", {"poolAdmissionQueue": 0})
    bg = Background()
    bg.send("hold-1", a, 150, stream=True)
    until(lambda: a.node.load.local + sum(a.node.load.forwarded.values()) == 1)
    bg.send("hold-2", a, 150, stream=True)
    until(lambda: a.node.load.local + sum(a.node.load.forwarded.values()) == 2)
    bg.send("third", a, 1)
    # sent at once, as the spec places: it waits inside a busy engine, behind work the pool cannot move
    assert until(lambda: any(s.stats()["queued"] == 1 for s in sims.values()))
    assert a.node.admission.status()["queued"] == 0
    bg.join()
    r = bg.results["third"][0]
    assert r.status_code == 200 and "x-hub-pool-queued-ms" not in r.headers
    assert row(a, r.headers["x-hub-pool-request-id"])["queuedMs"] is None


class _Gated:
    """An Ollama-shaped engine the test steers: a turn saying "hold" answers only when
    ``release`` is set, and while ``tags_delay`` is set its inventory (which a placement reads
    on every pass of the queue's pump, the probe TTL being 0) takes that long to answer.
    It keeps the X-Hub-Pool-* headers of each turn."""

    def __init__(self):
        self.release = threading.Event()
        self.tags_delay = 0.0
        self.tags_started = self.tags_done = 0
        self.turns: list[dict] = []

    def app(self) -> web.Application:
        async def tags(request):
            if self.tags_delay:
                self.tags_started += 1
                await asyncio.sleep(self.tags_delay)
                self.tags_done += 1
            return web.json_response({"models": [{"name": MODEL, "model": MODEL, "size": 1, "digest": "d",
                                                  "details": {"parameter_size": "8B"}}]})

        async def ps(request):
            return web.json_response({"models": [{"name": MODEL, "model": MODEL, "size_vram": 1,
                                                  "context_length": 8192}]})

        async def version(request):
            return web.json_response({"version": "0.12.6"})

        async def chat(request):
            body = await request.json()
            self.turns.append({k.lower(): v for k, v in request.headers.items() if k.lower().startswith("x-hub-pool")})
            if body["messages"][-1]["content"] == "hold":
                while not self.release.is_set():
                    await asyncio.sleep(0.01)
            return web.json_response({"model": MODEL, "message": {"role": "assistant", "content": "ok"},
                                      "done": True, "done_reason": "stop"})

        app = web.Application()
        app.router.add_get("/api/tags", tags)
        app.router.add_get("/api/ps", ps)
        app.router.add_get("/api/version", version)
        app.router.add_post("/api/chat", chat)
        return app


@pytest.fixture
def gated(tmp_path):
    """One node, its Ollama stated to run one request at a time, the queue on."""
    engine = _Gated()
    env = {"HUB_POOL_DEV_FIRST_BYTE_FLOOR_MS": "1000", "HUB_POOL_FIRST_BYTE_TIMEOUT_MS": "2500",
           "HUB_POOL_COMPLETION_TIMEOUT_MS": "6000"}
    with ThreadedApp(engine.app()) as server, RunningNode(tmp_path / "n", {"OLLAMA_URL": server.url, **env}) as node:
        op(node, "PATCH", "/settings", {"poolAdmissionQueue": 4})
        with node.client(headers=node.headers()) as c:
            assert c.patch("/api/inference/preferences", json={"ollamaSlots": 1}).status_code == 200
        yield node, engine
        engine.release.set()


def native(node, content, headers=None, timeout=30):
    return httpx.post(node.url + "/api/chat", headers=headers or {}, timeout=timeout,
                      json={"model": MODEL, "stream": False, "messages": [{"role": "user", "content": content}]})


def test_a_waiter_whose_app_hangs_up_while_the_pump_places_it_leaks_no_slot(gated):
    """Issue 26.11: the app hung up while the pump awaited the placement of its request; the
    pump went on to reserve a slot for it that nobody would ever release: inFlightRequests
    stayed 1 with nothing running, and every later queued request waited out its budget."""
    node, engine = gated
    bg = threading.Thread(target=native, args=(node, "hold"), kwargs={"timeout": 60})
    bg.start()
    assert until(lambda: node.node.load.local == 1)
    body = json.dumps({"model": MODEL, "stream": False, "messages": [{"role": "user", "content": "queued"}]})
    app = socket.create_connection(("127.0.0.1", node.port))  # an app whose hang-up the test times
    app.sendall(f"POST /api/chat HTTP/1.1\r\nHost: n\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
    assert until(lambda: node.node.admission.status()["queued"] == 1)
    engine.tags_delay = 3.0  # each placement now waits 3 s on the engine's inventory
    started = engine.tags_started
    assert until(lambda: engine.tags_started > started)  # the pump is placing it, for 3 s
    engine.release.set()  # meanwhile the slot frees: this placement will find it free ...
    bg.join(30)
    assert until(lambda: node.node.load.local == 0, timeout=2)
    app.close()  # ... and the app gives up before it ends
    assert until(lambda: node.node.admission.status()["abandoned"] == 1)
    assert until(lambda: engine.tags_done >= engine.tags_started)  # that placement finished
    engine.tags_delay = 0.0
    assert until(lambda: node.node.admission.status()["queued"] == 0)
    assert until(lambda: node.node.load.local == 0, timeout=3), "a slot stayed reserved for a gone app"
    assert op(node, "GET", "/status")["localNode"]["inFlightRequests"] == 0
    r = native(node, "after")  # not queued behind a phantom: served at once
    assert r.status_code == 200 and "x-hub-pool-queued-ms" not in r.headers, (r.status_code, r.text)


@pytest.mark.parametrize("header,source", [("X-Hub-Pool-Session", "X-Hub-Pool-Session"), ("session-id", "session-id")])
def test_a_queued_request_keeps_its_session_source(gated, header, source):
    """Issue 26.11: placed again by the queue, the request lost where its session came from:
    the affinity row named the wrong source and X-Hub-Pool-Session was not forwarded."""
    node, engine = gated
    op(node, "PATCH", "/settings", {"poolPrefixAffinityMaxInFlight": 2})
    bg = threading.Thread(target=native, args=(node, "hold"), kwargs={"timeout": 60})
    bg.start()
    assert until(lambda: node.node.load.local == 1)
    results = {}
    waiter = threading.Thread(target=lambda: results.setdefault("r", native(node, "queued", {header: "sess-1"})))
    waiter.start()
    assert until(lambda: node.node.admission.status()["queued"] == 1)
    engine.release.set()
    bg.join(30)
    waiter.join(30)
    r = results["r"]
    assert r.status_code == 200 and "x-hub-pool-queued-ms" in r.headers, r.text
    entry = row(node, r.headers["x-hub-pool-request-id"])
    assert entry["affinity"]["key"] == "header" and entry["affinity"]["keySource"] == source, entry["affinity"]
    sent = engine.turns[-1].get("x-hub-pool-session")
    assert sent == ("sess-1" if header == "X-Hub-Pool-Session" else None), engine.turns[-1]


def test_a_queued_agent_request_past_its_budget_gets_its_dialects_503(gated):
    """Every 503 and 502 on the agent routes is in the dialect's own shape (issue 26.25 checked
    this one too: it already was)."""
    node, _ = gated
    bg = threading.Thread(target=native, args=(node, "hold"), kwargs={"timeout": 60})
    bg.start()
    assert until(lambda: node.node.load.local == 1)
    r = httpx.post(node.url + "/v1/messages", timeout=30, json={
        "model": MODEL, "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "api_error", body
    assert "stayed busy" in body["error"]["message"]
