"""An app that hangs up after the engine's headers but before anything was relayed (issue
26.13): the walk reads a 500's body for a verdict, a non-streamed body to judge, or a
translated answer before sending it. The row is the spec's hang-up row and the engine is let go."""

from __future__ import annotations

import asyncio
import json
import logging
import socket

import pytest
from aiohttp import web
from aiohttp_thread import ThreadedApp
from harness import RunningNode, fqdn, make_pool, pair, poll_until_offered, wait_until


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


def hang_up_once_answered(node, route, body, state):
    """An app that sends ``body`` and closes its connection as soon as the engine has sent its
    headers (and nothing has reached the app)."""
    raw = json.dumps(body)
    app = socket.create_connection(("127.0.0.1", node.port))
    try:
        app.sendall(f"POST {route} HTTP/1.1\r\nHost: n\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(raw)}\r\n\r\n{raw}".encode())
        assert wait_until(lambda: state["answered"] == 1, timeout=20), state
        app.setblocking(False)
        with pytest.raises(BlockingIOError):
            app.recv(1)  # nothing was relayed to the app
    finally:
        app.close()


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
        hang_up_once_answered(node, route, {"model": "m:8b", **body}, state)
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
            hang_up_once_answered(a, "/v1/chat/completions",
                                  {"model": "m:8b", "messages": [{"role": "user", "content": "500"}]}, state)
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
