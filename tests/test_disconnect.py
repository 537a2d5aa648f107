"""A client that hangs up makes the node abort its upstream request (spec: Client hang-ups)."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
from aiohttp import web
from aiohttp_thread import ThreadedApp
from harness import RunningNode, fqdn, make_pool, pair, poll_until_offered, wait_until

from hubpool_sim import SimConfig, SimModel, run_in_thread


@pytest.fixture
def slow_sim():
    cfg = SimConfig(flavor="ollama", models=[SimModel("llama3.2:3b", window=8192)], decode_ms_per_token=50)
    with run_in_thread(cfg) as sim:
        yield sim


@pytest.mark.parametrize("route,body", [
    ("/api/chat", {"messages": [{"role": "user", "content": "tell me a long story"}], "options": {"num_predict": 400}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "long"}], "stream": True, "max_tokens": 400}),
])
def test_hang_up_mid_stream_aborts_upstream(tmp_path, slow_sim, route, body):
    with RunningNode(tmp_path / "n", {"OLLAMA_URL": slow_sim.url}) as node:
        with httpx.Client(base_url=node.url, timeout=30) as c:
            with c.stream("POST", route, json={"model": "llama3.2:3b", **body}) as r:
                assert r.status_code == 200
                rid = r.headers["x-hub-pool-request-id"]
                next(r.iter_raw())  # the stream is flowing
            # leaving the block closes the connection mid-stream
        assert wait_until(lambda: slow_sim.stats()["aborted"] >= 1), slow_sim.stats()
        with node.client(headers=node.headers()) as c:
            assert wait_until(lambda: next(
                e for e in c.get("/api/inference/pool/routing-log").json()["entries"] if e["id"] == rid
            )["clientClosed"] is True)


def test_hang_up_before_headers_aborts_upstream_and_is_not_failed_over(tmp_path, slow_sim):
    """Two candidates (issue 16.12: with one, a walk that failed over on a hang-up passed too):
    whichever is asked first hangs, the app gives up, and the other is never asked."""
    cfg = SimConfig(flavor="vllm", models=[SimModel("llama3.2:3b", window=8192)])
    with run_in_thread(cfg) as other, \
            RunningNode(tmp_path / "n", {"OLLAMA_URL": slow_sim.url, "VLLM_URL": other.url}) as node:
        sims = {"ollama": (slow_sim, "/api/chat"), "vllm": (other, "/v1/chat/completions")}
        for sim, _ in sims.values():
            sim.add_fault("hang", count=1)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(node.url + "/api/chat", json={"model": "llama3.2:3b", "messages": []}, timeout=1.0)
        assert wait_until(lambda: slow_sim.stats()["aborted"] + other.stats()["aborted"] >= 1)
        with node.client(headers=node.headers()) as c:
            row = c.get("/api/inference/pool/routing-log").json()["entries"][0]
        assert row["candidates"] == 2  # a second candidate was there to fail over to
        assert row["clientClosed"] is True and row["outcome"] == "failed"
        assert row["status"] is None and row["node"] == "local" and row["attempt"] == 1
        assert row["failedOverFrom"] == [] and row["attempts"] == []
        asked = {kind: sim.stats()["by_path"].get(path, 0) for kind, (sim, path) in sims.items()}
        assert asked == {row["backend"]: 1, ({"ollama", "vllm"} - {row["backend"]}).pop(): 0}, asked


class _Errors(logging.Handler):
    """Every record at ERROR or with a traceback, from the node's loggers and uvicorn's."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        if record.levelno >= logging.ERROR or record.exc_info:
            self.records.append(record)


@pytest.fixture
def node_errors():
    handler = _Errors()
    loggers = [logging.getLogger(), logging.getLogger("uvicorn.error"), logging.getLogger("uvicorn")]
    for lg in loggers:
        lg.addHandler(handler)
    yield handler.records
    for lg in loggers:
        lg.removeHandler(handler)


def _headers_then_nothing(state: dict) -> web.Application:
    """A vLLM-shaped engine that sends an answer's headers and then no byte of its body: a
    500 when the turn says "500" (the walk reads it for a verdict), else a non-streamed 200
    (the walk reads it whole to judge it). It notes when the node closes the connection."""
    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "m:8b", "object": "model",
                                                               "owned_by": "vllm", "max_model_len": 8192}]})

    async def chat(request):
        body = await request.json()
        status = 500 if "messages" in body and body["messages"][0]["content"] == "500" else 200
        resp = web.StreamResponse(status=status, headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        state["answered"] += 1
        try:
            for _ in range(1500):  # at most 30 s: the node should let go long before
                transport = request.transport
                if transport is None or transport.is_closing():
                    state["aborted"] += 1
                    break
                await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            state["aborted"] += 1
            raise
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/embeddings", chat)
    return app


@pytest.mark.parametrize("route,body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "500"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "judged 200"}]}),
    ("/api/embed", {"input": "translated, read whole before it is sent"}),
])
def test_hang_up_after_the_engines_headers_is_the_hang_up_row_and_lets_the_engine_go(tmp_path, node_errors, route,
                                                                                     body):
    """Issue 26.13: an app that hangs up while the walk reads a 500's verdict body or a
    non-streamed body to judge got clientClosed false, "ended without an answer", no
    durationMs and a ClientGone traceback, and the engine's connection stayed open. A
    translated answer read whole before it is sent is the same wait."""
    state = {"answered": 0, "aborted": 0}
    with ThreadedApp(_headers_then_nothing(state)) as engine, \
            RunningNode(tmp_path / "n", {"VLLM_URL": engine.url}) as node:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(node.url + route, timeout=1.0, json={"model": "m:8b", **body})
        assert state["answered"] == 1
        assert wait_until(lambda: state["aborted"] == 1), state  # the engine's connection was closed
        with node.client(headers=node.headers()) as c:
            assert wait_until(lambda: c.get("/api/inference/pool/routing-log").json()["entries"][0]["outcome"]
                              != "pending")
            row = c.get("/api/inference/pool/routing-log").json()["entries"][0]
        assert row["clientClosed"] is True and row["outcome"] == "failed", row
        assert row["status"] is None and row["node"] == "local" and row["durationMs"] is not None, row
        assert row["failedOverFrom"] == [] and row["attempts"] == [], row
        assert "the app closed its connection" in row["reason"], row
    assert not node_errors, [r.getMessage() for r in node_errors]


def test_a_forward_given_up_while_the_leaf_reads_its_engines_500_is_a_hang_up_there(tmp_path, node_errors):
    """Issue 26.13, the leaf's side: hub-b reads its engine's 500 before relaying it (to tell a
    verdict from a broken model) when hub-a, whose app hung up, closes the forward. hub-b's
    inbound row says the sender closed it, and hub-b lets its engine go."""
    state = {"answered": 0, "aborted": 0}
    with ThreadedApp(_headers_then_nothing(state)) as engine:
        nodes = make_pool(tmp_path, ["hub-a", "hub-b"], per_node={"hub-b": {"VLLM_URL": engine.url}})
        a, b = nodes["hub-a"], nodes["hub-b"]
        with a, b:
            pair(a, b)
            poll_until_offered(a, [b], "m:8b")
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(a.url + "/v1/chat/completions", timeout=1.5,
                           json={"model": "m:8b", "messages": [{"role": "user", "content": "500"}]})
            assert wait_until(lambda: state["aborted"] == 1), state
            with b.client(headers=b.headers()) as c:
                def inbound():
                    rows = c.get("/api/inference/pool/routing-log").json()["entries"]
                    return next((r for r in rows if r["direction"] == "inbound" and r["outcome"] != "pending"), None)
                assert wait_until(lambda: inbound() is not None)
                row = inbound()
            assert row["clientClosed"] is True and row["outcome"] == "failed" and row["status"] is None, row
            assert row["durationMs"] is not None and row["node"] == fqdn("hub-a"), row
    assert not node_errors, [r.getMessage() for r in node_errors]
