"""The official ollama Python client against a running node, in both directions of
translation: models on an Ollama engine pass through, models only an OpenAI-dialect
engine holds are translated."""

from __future__ import annotations

import httpx
import ollama
import pytest

MODELS = [("llama3.2:3b", "ollama"), ("qwen3:8b", "vllm")]
EMBED = [("nomic-embed-text", "ollama"), ("bge-small", "vllm")]


def _client(node) -> ollama.Client:
    return ollama.Client(host=node.url)


@pytest.mark.parametrize("model,backend", MODELS)
def test_chat_not_streamed(node, model, backend):
    answer = _client(node).chat(model=model, messages=[{"role": "user", "content": "hi"}], stream=False)
    assert answer.message.content and answer.done is True


@pytest.mark.parametrize("model,backend", MODELS)
def test_chat_streamed(node, model, backend):
    parts = list(_client(node).chat(model=model, messages=[{"role": "user", "content": "hi"}], stream=True))
    assert "".join(p.message.content or "" for p in parts)
    assert parts[-1].done is True
    assert all(p.done is False for p in parts[:-1])


@pytest.mark.parametrize("model,backend", MODELS)
def test_generate(node, model, backend):
    answer = _client(node).generate(model=model, prompt="Once upon", stream=False)
    assert answer.response and answer.done
    parts = list(_client(node).generate(model=model, prompt="Once upon", stream=True))
    assert parts[-1].done is True and "".join(p.response for p in parts)


@pytest.mark.parametrize("model,backend", EMBED)
def test_embed(node, model, backend):
    answer = _client(node).embed(model=model, input=["a", "b"])
    assert len(answer.embeddings) == 2 and len(answer.embeddings[0]) > 0
    single = _client(node).embeddings(model=model, prompt="a")
    assert len(single.embedding) > 0


def test_list_merges_every_local_engine(node):
    names = {m.model for m in _client(node).list().models}
    assert {"llama3.2:3b", "qwen3:8b", "bge-small", "nomic-embed-text"} <= names


@pytest.mark.parametrize("model,backend", MODELS)
def test_show(node, model, backend):
    answer = _client(node).show(model)
    assert answer.modelinfo is not None or answer.details is not None


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


def test_upstream_hub_pool_headers_are_dropped(node, ollama_sim):
    # the simulated engine could send anything; attribution must be the node's own
    with node.client() as c:
        r = c.post("/api/embed", json={"model": "nomic-embed-text", "input": "x"})
    assert r.status_code == 200
    assert [v for k, v in r.headers.multi_items() if k == "x-hub-pool-served-by"] == ["local"]


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
