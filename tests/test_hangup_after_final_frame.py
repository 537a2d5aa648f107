"""An app that hangs up after the answer's final frame and before the stream's own end is served,
not a hang-up (issue 25: Codex 0.169 closes its connection on response.completed, and a real
llama-server keeps the stream open a moment longer; the node recorded turns it had served in
full as "the app closed its connection mid-response").

A vLLM-shaped engine the test controls streams a whole chat answer (its finish_reason and
[DONE]) and then holds the connection open; the app reads up to [DONE] and closes. A second
app closes half-way through, which is still the spec's hang-up row.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from aiohttp import web
from aiohttp_thread import ThreadedApp
from harness import RunningNode, wait_until

MODEL = "m:8b"


def _chunk(delta: dict, finish: str | None = None) -> bytes:
    frame = {"id": "c1", "object": "chat.completion.chunk", "model": MODEL,
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(frame).encode() + b"\n\n"


def _lingering_engine(state: dict) -> web.Application:
    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "vllm",
                                                               "max_model_len": 8192}]})

    async def chat(request):
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_chunk({"role": "assistant", "content": ""}))
        await resp.write(_chunk({"content": "Hello"}))
        if body["messages"][0]["content"] == "whole":
            await resp.write(_chunk({}, "stop") + b"data: [DONE]\n\n")
        else:
            await resp.write(_chunk({"content": " there"}))  # and the answer never finishes
        try:  # the stream's end does not come: at most 30 s, the node lets go long before
            for _ in range(1500):
                if request.transport is None or request.transport.is_closing():
                    break
                await asyncio.sleep(0.02)
        finally:
            state["released"] += 1
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    return app


@pytest.fixture
def node(tmp_path):
    state = {"released": 0}
    with ThreadedApp(_lingering_engine(state)) as engine, \
            RunningNode(tmp_path / "n", {"VLLM_URL": engine.url}) as n:
        n.state = state
        yield n


def _read_until_then_close(node: RunningNode, content: str, marker: bytes) -> str:
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": content}]}
    with httpx.Client(timeout=30) as client, client.stream("POST", node.url + "/v1/chat/completions",
                                                           json=body) as r:
        seen = b""
        for chunk in r.iter_raw():
            seen += chunk
            if marker in seen:
                break  # the app hangs up here, with the engine's stream still open
        return r.headers["x-hub-pool-request-id"]


def _row(node: RunningNode, rid: str) -> dict:
    with node.client(headers=node.headers()) as c:
        return next(e for e in c.get("/api/inference/pool/routing-log?limit=20").json()["entries"] if e["id"] == rid)


def test_an_app_that_closes_after_the_final_frame_was_served(node):
    rid = _read_until_then_close(node, "whole", b"[DONE]")
    assert wait_until(lambda: _row(node, rid)["totalMs"] is not None, timeout=30)
    row = _row(node, rid)
    assert row["outcome"] == "served" and row["status"] == 200 and row["clientClosed"] is False, row
    assert row["reason"] is None and row["requestError"] is None
    assert wait_until(lambda: node.state["released"] == 1, timeout=30)  # the engine was let go


def test_an_app_that_closes_mid_answer_is_still_a_hang_up(node):
    rid = _read_until_then_close(node, "cut", b"Hello")
    assert wait_until(lambda: _row(node, rid)["totalMs"] is not None, timeout=30)
    row = _row(node, rid)
    assert row["outcome"] == "failed" and row["clientClosed"] is True, row
    assert "closed its connection mid-response" in row["reason"]
    assert wait_until(lambda: node.state["released"] == 1, timeout=30)
