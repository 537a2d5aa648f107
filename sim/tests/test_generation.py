"""Chat, completions and embeddings in both dialects, streamed and not; errors per flavor."""

from __future__ import annotations

import math

import httpx
import pytest

from hubpool_sim import SimConfig, SimModel, run_in_thread
from hubpool_sim.testing import ndjson_lines, sse_events

FLAVORS = ("ollama", "vllm", "llamacpp", "lemonade", "omlx")
PREFIX = {"ollama": "/v1", "vllm": "/v1", "llamacpp": "/v1", "lemonade": "/api/v1", "omlx": "/v1"}
CHAT = "llama3.2:3b"
ANSWER = "tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7"


def chat(content: str = "hello there", **extra):
    return {"model": CHAT, "messages": [{"role": "user", "content": content}], **extra}


@pytest.mark.parametrize("flavor", FLAVORS)
def test_openai_chat_not_streamed(flavor):
    with run_in_thread(SimConfig(flavor=flavor)) as sim:
        response = httpx.post(sim.url + PREFIX[flavor] + "/chat/completions", json=chat())
    body = response.json()
    assert response.status_code == 200
    assert body["object"] == "chat.completion" and body["model"] == CHAT and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": ANSWER}
    assert choice["finish_reason"] == "stop"
    prompt_tokens = math.ceil(len(b"user: hello there\n") / 4)
    assert body["usage"]["prompt_tokens"] == prompt_tokens
    assert body["usage"]["completion_tokens"] == 8 and body["usage"]["total_tokens"] == prompt_tokens + 8


@pytest.mark.parametrize("flavor", FLAVORS)
def test_openai_chat_streamed(flavor):
    with run_in_thread(SimConfig(flavor=flavor)) as sim:
        response = httpx.post(
            sim.url + PREFIX[flavor] + "/chat/completions",
            json=chat(stream=True, stream_options={"include_usage": True}),
        )
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == ANSWER
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 8


@pytest.mark.parametrize("flavor", ["vllm", "llamacpp"])
def test_openai_completions_streamed_and_not(flavor):
    with run_in_thread(SimConfig(flavor=flavor)) as sim:
        plain = httpx.post(sim.url + "/v1/completions", json={"model": CHAT, "prompt": "Once", "max_tokens": 3}).json()
        streamed = httpx.post(sim.url + "/v1/completions", json={"model": CHAT, "prompt": "Once", "stream": True}).text
    assert plain["object"] == "text_completion"
    assert plain["choices"][0]["text"] == "tok0 tok1 tok2"
    assert plain["choices"][0]["finish_reason"] == "length"  # max_tokens hit
    events = sse_events(streamed)
    assert events[-1] == "[DONE]"
    assert all(e["object"] == "text_completion" for e in events[:-1])
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == ANSWER
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


def test_max_tokens_sets_the_length():
    with run_in_thread(SimConfig(flavor="vllm", tokens=20)) as sim:
        short = httpx.post(sim.url + "/v1/chat/completions", json=chat(max_tokens=5)).json()
        long = httpx.post(sim.url + "/v1/chat/completions", json=chat(max_tokens=50)).json()
        natural = httpx.post(sim.url + "/v1/chat/completions", json=chat()).json()
    assert short["choices"][0]["message"]["content"] == "tok0 tok1 tok2 tok3 tok4"
    assert short["choices"][0]["finish_reason"] == "length" and short["usage"]["completion_tokens"] == 5
    assert long["usage"]["completion_tokens"] == 50 and long["choices"][0]["finish_reason"] == "length"
    assert natural["usage"]["completion_tokens"] == 20 and natural["choices"][0]["finish_reason"] == "stop"


def test_native_chat_streams_by_default():
    with run_in_thread(SimConfig()) as sim:
        response = httpx.post(sim.url + "/api/chat", json=chat())
    assert response.headers["content-type"] == "application/x-ndjson"
    lines = ndjson_lines(response.text)
    assert all(line["done"] is False for line in lines[:-1])
    assert "".join(line["message"]["content"] for line in lines) == ANSWER
    assert lines[0]["message"]["role"] == "assistant" and lines[0]["model"] == CHAT and lines[0]["created_at"]
    final = lines[-1]
    assert final["done"] is True and final["done_reason"] == "stop" and final["message"]["content"] == ""
    for key in ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration"):
        assert isinstance(final[key], int)
    assert final["eval_count"] == 8 and final["prompt_eval_count"] == math.ceil(len(b"user: hello there\n") / 4)


def test_native_chat_and_generate_not_streamed():
    with run_in_thread(SimConfig()) as sim:
        chat_body = httpx.post(sim.url + "/api/chat", json=chat(stream=False, options={"num_predict": 2})).json()
        generated = httpx.post(sim.url + "/api/generate", json={"model": CHAT, "prompt": "Why?", "stream": False}).json()
        streamed = ndjson_lines(httpx.post(sim.url + "/api/generate", json={"model": CHAT, "prompt": "Why?"}).text)
    assert chat_body["done"] is True and chat_body["done_reason"] == "length"
    assert chat_body["message"] == {"role": "assistant", "content": "tok0 tok1"}
    assert generated["done"] is True and generated["response"] == ANSWER and "message" not in generated
    assert "".join(line["response"] for line in streamed) == ANSWER and streamed[-1]["done"] is True


def test_native_load_and_unload_without_messages():
    with run_in_thread(SimConfig()) as sim:
        loaded = httpx.post(sim.url + "/api/chat", json={"model": CHAT}).json()
        assert [m["name"] for m in httpx.get(sim.url + "/api/ps").json()["models"]] == [CHAT]
        unloaded = httpx.post(sim.url + "/api/generate", json={"model": CHAT, "keep_alive": 0}).json()
        assert httpx.get(sim.url + "/api/ps").json()["models"] == []
    assert (loaded["done"], loaded["done_reason"]) == (True, "load")
    assert (unloaded["done"], unloaded["done_reason"]) == (True, "unload")


def test_native_num_ctx_truncates_and_shows_in_ps():
    long_prompt = "x" * 4000  # 1000 tokens
    with run_in_thread(SimConfig()) as sim:
        body = httpx.post(sim.url + "/api/generate", json={"model": CHAT, "prompt": long_prompt, "stream": False,
                                                           "options": {"num_ctx": 512}}).json()
        ps = httpx.get(sim.url + "/api/ps").json()["models"]
    assert body["prompt_eval_count"] == 512  # Ollama truncates instead of refusing
    assert ps[0]["context_length"] == 512


def test_embeddings_both_dialects():
    cfg = SimConfig(embedding_dim=16)
    with run_in_thread(cfg) as sim:
        embed = httpx.post(sim.url + "/api/embed", json={"model": "nomic-embed-text", "input": ["a", "b"]}).json()
        single = httpx.post(sim.url + "/api/embed", json={"model": "nomic-embed-text", "input": "a"}).json()
        legacy = httpx.post(sim.url + "/api/embeddings", json={"model": "nomic-embed-text", "prompt": "a"}).json()
        openai = httpx.post(sim.url + "/v1/embeddings", json={"model": "nomic-embed-text", "input": ["a", "b"]}).json()
    assert embed["model"] == "nomic-embed-text" and len(embed["embeddings"]) == 2
    assert all(len(v) == 16 for v in embed["embeddings"])
    assert {"total_duration", "load_duration", "prompt_eval_count"} <= set(embed)
    assert single["embeddings"][0] == embed["embeddings"][0] == legacy["embedding"]  # deterministic
    assert embed["embeddings"][0] != embed["embeddings"][1]
    assert math.isclose(sum(v * v for v in legacy["embedding"]), 1.0, abs_tol=1e-4)
    assert openai["object"] == "list" and openai["model"] == "nomic-embed-text"
    assert [(d["object"], d["index"]) for d in openai["data"]] == [("embedding", 0), ("embedding", 1)]
    assert openai["data"][0]["embedding"] == legacy["embedding"]
    assert openai["usage"] == {"prompt_tokens": 2, "total_tokens": 2}


@pytest.mark.parametrize(
    ("flavor", "path", "expected"),
    [
        ("ollama", "/api/chat", {"error": 'model "ghost" not found, try pulling it first'}),
        ("ollama", "/v1/chat/completions",
         {"error": {"message": 'model "ghost" not found, try pulling it first', "type": "not_found_error", "param": None, "code": None}}),
        ("vllm", "/v1/chat/completions",
         {"object": "error", "message": "The model `ghost` does not exist.", "type": "NotFoundError", "param": None, "code": 404}),
        ("llamacpp", "/v1/chat/completions", {"error": {"code": 404, "message": "model 'ghost' not found", "type": "not_found_error"}}),
        ("lemonade", "/api/v1/chat/completions", {"error": {"message": "model 'ghost' not found", "type": "not_found_error"}}),
        ("omlx", "/v1/chat/completions", {"error": {"message": "Model 'ghost' not found", "type": "not_found_error", "code": 404}}),
    ],
)
def test_unknown_model_gets_the_flavors_not_found(flavor, path, expected):
    with run_in_thread(SimConfig(flavor=flavor)) as sim:
        response = httpx.post(sim.url + path, json={"model": "ghost", "messages": [{"role": "user", "content": "hi"}]})
    assert (response.status_code, response.json()) == (404, expected)


def test_prompt_over_the_window():
    prompt = "y" * (4 * 1500)  # 1500 tokens against a 1024 window
    models = [SimModel(CHAT, window=1024)]
    with run_in_thread(SimConfig(flavor="llamacpp", models=models)) as sim:
        llama = httpx.post(sim.url + "/v1/completions", json={"model": CHAT, "prompt": prompt})
    with run_in_thread(SimConfig(flavor="vllm", models=models)) as sim:
        vllm = httpx.post(sim.url + "/v1/completions", json={"model": CHAT, "prompt": prompt, "max_tokens": 10})
    assert llama.status_code == 400
    assert llama.json() == {"error": {
        "code": 400,
        "message": "request (1500 tokens) exceeds the available context size (1024 tokens), try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 1500,
        "n_ctx": 1024,
    }}
    assert vllm.status_code == 400
    assert vllm.json()["message"].startswith(
        "This model's maximum context length is 1024 tokens. However, you requested 1510 tokens (1500 in the messages, 10 in the completion)."
    )


def test_api_key_required_except_on_health():
    with run_in_thread(SimConfig(flavor="llamacpp", api_key="sekret")) as sim:
        refused = httpx.post(sim.url + "/v1/chat/completions", json=chat())
        wrong = httpx.get(sim.url + "/v1/models", headers={"Authorization": "Bearer nope"})
        allowed = httpx.post(sim.url + "/v1/chat/completions", json=chat(), headers={"Authorization": "Bearer sekret"})
        health = httpx.get(sim.url + "/health")
        last = sim.stats()["last_request"]
    assert refused.status_code == 401 and wrong.status_code == 401
    assert refused.json() == {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}
    assert allowed.status_code == 200 and health.status_code == 200
    assert last["headers"] == {"authorization": False} and last["path"] == "/health"


def test_stats_record_the_last_request():
    with run_in_thread(SimConfig(flavor="vllm")) as sim:
        body = chat()
        httpx.post(sim.url + "/v1/chat/completions", json=body,
                   headers={"X-Hub-Pool-Model": CHAT, "X-Hub-Pool-Session": "s1", "Authorization": "Bearer k", "X-Other": "no"})
        stats = sim.stats()
    assert stats["requests"] == 1 and stats["by_path"] == {"/v1/chat/completions": 1} and stats["completed"] == 1
    last = stats["last_request"]
    assert last["path"] == "/v1/chat/completions" and last["model"] == CHAT
    assert last["headers"] == {"x-hub-pool-model": CHAT, "x-hub-pool-session": "s1", "authorization": True}
    assert last["body_bytes"] > 0
