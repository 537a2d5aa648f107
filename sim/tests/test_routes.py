"""Each flavor's listing, health and status routes, over a real socket."""

from __future__ import annotations

import httpx
import pytest

from hubpool_sim import SimConfig, SimModel, run_in_thread

MODELS = [SimModel("qwen3:8b", window=32768), SimModel("nomic-embed-text", window=2048, embedding=True)]


def config(flavor: str, **kwargs) -> SimConfig:
    return SimConfig(flavor=flavor, models=list(MODELS), **kwargs)


@pytest.mark.parametrize(
    ("flavor", "path", "owned_by"),
    [("ollama", "/v1/models", "library"), ("vllm", "/v1/models", "vllm"), ("llamacpp", "/v1/models", "llamacpp"),
     ("lemonade", "/api/v1/models", "lemonade"), ("omlx", "/v1/models", "omlx")],
)
def test_openai_model_listing(flavor, path, owned_by):
    with run_in_thread(config(flavor)) as sim:
        body = httpx.get(sim.url + path).json()
    assert body["object"] == "list"
    first = body["data"][0]
    assert (first["id"], first["object"], first["owned_by"]) == ("qwen3:8b", "model", owned_by)
    assert isinstance(first["created"], int)
    if flavor == "vllm":
        assert (first["root"], first["parent"], first["max_model_len"]) == ("qwen3:8b", None, 32768)
    if flavor == "llamacpp":
        assert first["meta"]["n_ctx_train"] == 32768
        assert first["meta"]["n_params"] == 8_000_000_000 and first["meta"]["size"] > 0


def test_health_routes():
    with run_in_thread(config("vllm")) as sim:
        response = httpx.get(sim.url + "/health")
        assert (response.status_code, response.content) == (200, b"")
    with run_in_thread(config("llamacpp")) as sim:
        assert httpx.get(sim.url + "/health").json() == {"status": "ok"}
    with run_in_thread(config("omlx")) as sim:
        assert httpx.get(sim.url + "/health").json() == {"status": "healthy"}
    with run_in_thread(config("ollama")) as sim:
        assert httpx.get(sim.url + "/").text == "Ollama is running"
        assert httpx.get(sim.url + "/api/version").json() == {"version": "0.12.6"}


def test_lemonade_health_names_the_loaded_model():
    with run_in_thread(config("lemonade")) as sim:
        before = httpx.get(sim.url + "/api/v1/health").json()
        assert before["status"] == "ok" and before["model_loaded"] is None and before["all_models_loaded"] == []
        httpx.post(sim.url + "/api/v1/chat/completions", json={"model": "qwen3:8b", "messages": [{"role": "user", "content": "hi"}]})
        after = httpx.get(sim.url + "/api/v1/health").json()
    assert after["model_loaded"] == "qwen3:8b"
    assert after["checkpoint_loaded"]
    loaded = after["all_models_loaded"][0]
    assert loaded["model_name"] == "qwen3:8b" and loaded["device"] == "gpu" and loaded["type"] == "llm"
    assert loaded["recipe"] == "llamacpp" and loaded["recipe_options"] == {"ctx_size": 32768}


def test_llamacpp_props_and_slots():
    with run_in_thread(config("llamacpp", slots=3)) as sim:
        props = httpx.get(sim.url + "/props").json()
        slots = httpx.get(sim.url + "/slots").json()
    assert props["default_generation_settings"] == {"n_ctx": 32768}
    assert props["total_slots"] == 3 and props["model_path"] == "/models/qwen3:8b" and props["chat_template"]
    assert [(s["id"], s["is_processing"]) for s in slots] == [(0, False), (1, False), (2, False)]


def test_vllm_metrics_gauges():
    with run_in_thread(config("vllm")) as sim:
        text = httpx.get(sim.url + "/metrics").text
    assert 'vllm:num_requests_running{engine="0",model_name="qwen3:8b"} 0.0' in text
    assert 'vllm:num_requests_waiting{engine="0",model_name="qwen3:8b"} 0.0' in text


def test_ollama_tags_show_and_ps():
    with run_in_thread(config("ollama", preloaded=["nomic-embed-text"])) as sim:
        tags = httpx.get(sim.url + "/api/tags").json()["models"]
        ps_before = httpx.get(sim.url + "/api/ps").json()["models"]
        httpx.post(sim.url + "/api/chat", json={"model": "qwen3:8b", "messages": [{"role": "user", "content": "hi"}], "stream": False})
        ps_after = httpx.get(sim.url + "/api/ps").json()["models"]
        show = httpx.post(sim.url + "/api/show", json={"model": "qwen3:8b"}).json()
        missing = httpx.post(sim.url + "/api/show", json={"model": "nope"})
        embed_show = httpx.post(sim.url + "/api/show", json={"model": "nomic-embed-text"}).json()
    assert [t["name"] for t in tags] == ["qwen3:8b", "nomic-embed-text"]
    first = tags[0]
    assert set(first) == {"name", "model", "modified_at", "size", "digest", "details"}
    assert first["details"]["format"] == "gguf" and first["details"]["family"] == "qwen"
    assert first["details"]["parameter_size"] == "8B" and first["details"]["quantization_level"] == "Q4_K_M"

    assert [m["name"] for m in ps_before] == ["nomic-embed-text"]
    assert [m["name"] for m in ps_after] == ["qwen3:8b", "nomic-embed-text"]
    resident = ps_after[0]
    assert {"name", "model", "size", "digest", "details", "expires_at", "size_vram", "context_length"} <= set(resident)
    assert resident["context_length"] == 32768 and resident["size_vram"] == resident["size"]

    assert show["model_info"]["general.architecture"] == "llama"
    assert show["model_info"]["llama.context_length"] == 32768
    assert show["capabilities"] == ["completion", "tools"] and show["details"]["format"] == "gguf"
    assert {"modelfile", "parameters", "template"} <= set(show)
    assert embed_show["capabilities"] == ["embedding"]
    assert (missing.status_code, missing.json()) == (404, {"error": "model 'nope' not found"})


def test_routes_follow_the_flavor():
    with run_in_thread(config("vllm")) as sim:
        assert httpx.post(sim.url + "/api/chat", json={"model": "qwen3:8b"}).status_code == 404
        assert httpx.get(sim.url + "/api/tags").status_code == 404
    with run_in_thread(config("lemonade")) as sim:
        assert httpx.get(sim.url + "/v1/models").status_code == 404
        assert httpx.get(sim.url + "/health").status_code == 404
