"""The official OpenAI SDK against a running node backed by simulated engines."""

from __future__ import annotations

import openai
import pytest


def _client(node) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="unused-inside", max_retries=0)


def _check_headers(headers, backend: str, model: str) -> None:
    assert headers["x-hub-pool-served-by"] == "local"
    assert headers["x-hub-pool-backend"] == backend
    assert headers["x-hub-pool-model"] == model
    assert len(headers["x-hub-pool-request-id"]) == 36


@pytest.mark.parametrize("model,backend", [("qwen3:8b", "vllm"), ("llama3.2:3b", "ollama")])
def test_chat_not_streamed(node, model, backend):
    raw = _client(node).chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=5)
    _check_headers(raw.headers, backend, model)
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert completion.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("model,backend", [("qwen3:8b", "vllm"), ("llama3.2:3b", "ollama")])
def test_chat_streamed(node, model, backend):
    with _client(node).chat.completions.with_streaming_response.create(
        model=model, messages=[{"role": "user", "content": "hello"}], stream=True, max_tokens=6,
    ) as response:
        _check_headers(response.headers, backend, model)
        chunks = list(response.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)


def test_completions(node):
    raw = _client(node).completions.with_raw_response.create(model="qwen3:8b", prompt="Once", max_tokens=4)
    _check_headers(raw.headers, "vllm", "qwen3:8b")
    assert raw.parse().choices[0].text


@pytest.mark.parametrize("model,backend", [("bge-small", "vllm"), ("nomic-embed-text", "ollama")])
def test_embeddings(node, model, backend):
    raw = _client(node).embeddings.with_raw_response.create(model=model, input=["a", "b"])
    _check_headers(raw.headers, backend, model)
    data = raw.parse().data
    assert len(data) == 2 and len(data[0].embedding) > 0


def test_models_list_merges_every_local_engine(node):
    ids = {m.id for m in _client(node).models.list()}
    assert {"qwen3:8b", "bge-small", "llama3.2:3b", "nomic-embed-text"} <= ids


def test_pool_prefix_serves_the_same_routes(node):
    client = openai.OpenAI(base_url=node.url + "/api/inference/pool/v1", api_key="x", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="qwen3:8b", messages=[{"role": "user", "content": "hi"}])
    _check_headers(raw.headers, "vllm", "qwen3:8b")


def test_routing_log_rows_match_request_ids(node):
    raw = _client(node).chat.completions.with_raw_response.create(
        model="qwen3:8b", messages=[{"role": "user", "content": "hi"}])
    rid = raw.headers["x-hub-pool-request-id"]
    with node.client(headers=node.headers()) as c:
        log = c.get("/api/inference/pool/routing-log").json()
    row = next(e for e in log["entries"] if e["id"] == rid)
    assert row["outcome"] == "served" and row["node"] == "local" and row["backend"] == "vllm"
    assert row["status"] == 200 and row["attempt"] == 1
    assert "hi" not in str(row)  # metadata only, never the prompt
