"""The official ollama Python client against a running node, in both directions of
translation: models on an Ollama engine pass through, models only an OpenAI-dialect
engine holds are translated."""

from __future__ import annotations

import httpx
import ollama
import pytest

MODELS = [("llama3.2:3b", "ollama"), ("qwen3:8b", "vllm")]
EMBED = [("nomic-embed-text", "ollama"), ("bge-small", "vllm")]


class _Recording(ollama.Client):
    """The official client, with every response's headers kept for the test to check."""

    def __init__(self, host: str):
        self.seen: list[httpx.Headers] = []
        super().__init__(host=host, event_hooks={"response": [lambda r: self.seen.append(r.headers)]})


def _client(node) -> _Recording:
    return _Recording(node.url)


def _check_headers(client: _Recording, backend: str, model: str, logged: bool = True) -> None:
    assert client.seen
    for headers in client.seen:
        assert headers["x-hub-pool-served-by"] == "local"
        assert headers["x-hub-pool-backend"] == backend
        assert headers["x-hub-pool-model"] == model
        if logged:  # /api/show opens no routing-log row (spec), so it has no request id
            assert len(headers["x-hub-pool-request-id"]) == 36


@pytest.mark.parametrize("model,backend", MODELS)
def test_chat_not_streamed(node, model, backend):
    client = _client(node)
    answer = client.chat(model=model, messages=[{"role": "user", "content": "hi"}], stream=False)
    assert answer.message.content and answer.done is True
    _check_headers(client, backend, model)


@pytest.mark.parametrize("model,backend", MODELS)
def test_chat_streamed(node, model, backend):
    client = _client(node)
    parts = list(client.chat(model=model, messages=[{"role": "user", "content": "hi"}], stream=True))
    _check_headers(client, backend, model)
    assert "".join(p.message.content or "" for p in parts)
    assert parts[-1].done is True
    assert all(p.done is False for p in parts[:-1])


@pytest.mark.parametrize("model,backend", MODELS)
def test_generate(node, model, backend):
    client = _client(node)
    answer = client.generate(model=model, prompt="Once upon", stream=False)
    assert answer.response and answer.done
    parts = list(client.generate(model=model, prompt="Once upon", stream=True))
    assert parts[-1].done is True and "".join(p.response for p in parts)
    _check_headers(client, backend, model)


@pytest.mark.parametrize("model,backend", EMBED)
def test_embed(node, model, backend):
    client = _client(node)
    answer = client.embed(model=model, input=["a", "b"])
    assert len(answer.embeddings) == 2 and len(answer.embeddings[0]) > 0
    single = client.embeddings(model=model, prompt="a")
    assert len(single.embedding) > 0
    _check_headers(client, backend, model)


def test_list_merges_every_local_engine(node):
    names = {m.model for m in _client(node).list().models}
    assert {"llama3.2:3b", "qwen3:8b", "bge-small", "nomic-embed-text"} <= names


@pytest.mark.parametrize("model,backend", MODELS)
def test_show(node, model, backend):
    client = _client(node)
    answer = client.show(model)
    assert answer.modelinfo is not None or answer.details is not None
    _check_headers(client, backend, model, logged=False)


@pytest.mark.parametrize("model,backend", MODELS)
@pytest.mark.parametrize("route,body", [
    ("/api/chat", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/api/generate", {"prompt": "hi"}),
])
def test_native_routes_carry_attribution_headers(node, model, backend, route, body):
    with node.client() as c, c.stream("POST", route, json={"model": model, **body}) as r:
        assert r.status_code == 200
        assert r.headers["x-hub-pool-served-by"] == "local"
        assert r.headers["x-hub-pool-backend"] == backend
        assert r.headers["x-hub-pool-model"] == model
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [line for line in r.iter_lines() if line]
    assert '"done": true' in lines[-1].replace('"done":true', '"done": true')


def test_upstream_hub_pool_headers_are_dropped(tmp_path):
    """An engine (or a peer) sending x-hub-pool-* headers never speaks for this node."""
    import asyncio
    import threading

    from aiohttp import web
    from harness import RunningNode

    async def models(_request):
        return web.json_response({"object": "list", "data": [{"id": "m1", "object": "model", "owned_by": "vllm"}]})

    async def chat(_request):
        return web.json_response(
            {"choices": [{"message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}]},
            headers={"X-Hub-Pool-Served-By": "evil.example.ts.net", "X-Hub-Pool-Backend": "evil",
                     "X-Hub-Pool-Request-Id": "forged", "X-Engine-Note": "kept"})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        with RunningNode(tmp_path / "n", {"VLLM_URL": f"http://127.0.0.1:{port}"}) as node, node.client() as c:
            r = c.post("/v1/chat/completions", json={"model": "m1", "messages": [{"role": "user", "content": "q"}]})
            assert r.status_code == 200
            assert r.headers.get_list("x-hub-pool-served-by") == ["local"]
            assert r.headers.get_list("x-hub-pool-backend") == ["vllm"]
            assert r.headers["x-hub-pool-request-id"] != "forged"
            assert r.headers["x-engine-note"] == "kept"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def test_version_and_ps(node):
    with node.client() as c:
        assert isinstance(c.get("/api/version").json()["version"], str)
        assert "models" in c.get("/api/ps").json()
    assert httpx.get(node.url + "/api/tags").status_code == 200


def test_translated_stream_cut_by_the_engine_stays_cut(tmp_path):
    """A translated NDJSON stream gets done:true only when the engine really finished."""
    import json

    from harness import RunningNode

    from hubpool_sim import SimConfig, SimModel, run_in_thread

    with run_in_thread(SimConfig(flavor="vllm", models=[SimModel("qwen3:8b", window=8192)])) as sim:
        sim.add_fault("cut", count=1)
        with RunningNode(tmp_path / "n", {"VLLM_URL": sim.url}) as node, node.client() as c:
            with c.stream("POST", "/api/chat", json={"model": "qwen3:8b",
                                                     "messages": [{"role": "user", "content": "hi"}]}) as r:
                lines = [json.loads(line) for line in r.iter_lines() if line]
            assert lines and all(line.get("done") is not True for line in lines)
            whole = c.post("/api/chat", json={"model": "qwen3:8b", "stream": False,
                                              "messages": [{"role": "user", "content": "hi"}]}).json()
            assert whole["done"] is True and whole["message"]["content"]
