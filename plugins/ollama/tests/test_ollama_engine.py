import json
from pathlib import Path

import httpx
import pytest
from hubpool_ollama.engine import OllamaEngine

from hubpool_core import NATIVE, OPENAI, REQUEST_ERROR_SIGNATURES, EngineConfig, ResidentModel, Timings
from hubpool_core.testing import mock_http, raising, run

DATA = Path(__file__).parent / "data"
URL = "http://127.0.0.1:11434"


def load(name):
    return json.loads((DATA / name).read_text())


def engine(api_key=None):
    return OllamaEngine(EngineConfig(base_url=URL, api_key=api_key))


def serving(routes, seen=None):
    return mock_http(routes, missing=(404, "404 page not found"), seen=seen)


def test_class_attributes():
    assert OllamaEngine.kind == "ollama"
    assert OllamaEngine.env_var == "OLLAMA_URL"
    assert OllamaEngine.default_url == "http://127.0.0.1:11434"
    assert OllamaEngine.dialects == frozenset({OPENAI, NATIVE})
    assert OllamaEngine.openai_prefix == "/v1"
    assert OllamaEngine.renders_own_template
    assert OllamaEngine.states_slots
    assert OllamaEngine.has_residency


def test_probe_healthy_passes_metadata_through():
    seen = []
    result = run(engine().probe(serving({"/api/tags": (200, load("tags.json"))}, seen)))
    assert result.running and result.healthy and result.error is None and result.slots is None
    first, second = result.models
    assert first.id == "qwen3.6:35b"
    assert first.context_window is None  # Ollama's API does not state it
    assert first.size == 23894536842
    assert first.digest.startswith("7c1f3e9a")
    assert first.modified_at == "2026-09-20T14:02:11.374417163Z"
    assert first.details["parameter_size"] == "35.1B"
    assert second.id == "nomic-embed-text:latest"
    assert "authorization" not in seen[0].headers


def test_probe_with_nothing_pulled_is_healthy():
    for body in ({"models": []}, {"models": None}):
        result = run(engine().probe(serving({"/api/tags": (200, body)})))
        assert result.healthy and result.models == ()


def test_probe_engine_down():
    result = run(engine().probe(mock_http(raising(httpx.ConnectError))))
    assert not result.running and not result.healthy and result.models == ()
    assert result.error == f"connection refused at {URL} (is Ollama running? set OLLAMA_URL)"


@pytest.mark.parametrize("answer", [(404, "404 page not found"), (200, "Ollama is running"),
                                    (200, {"data": []}), (200, ["x"]), (500, {"error": "boom"})])
def test_probe_of_something_else_is_unhealthy(answer):
    result = run(engine().probe(serving({"/api/tags": answer})))
    assert result.running and not result.healthy and result.error


def test_probe_sends_a_configured_key():
    seen = []
    run(engine(api_key="k").probe(serving({"/api/tags": (200, load("tags.json"))}, seen)))
    assert seen[0].headers["authorization"] == "Bearer k"


def test_residency_reads_api_ps():
    assert run(engine().residency(serving({"/api/ps": (200, load("ps.json"))}))) == [
        ResidentModel(id="qwen3.6:35b", context_window=32768, size_vram=31771195392)]


def test_residency_nothing_loaded_and_unreadable():
    assert run(engine().residency(serving({"/api/ps": (200, {"models": []})}))) == []
    assert run(engine().residency(mock_http(raising(httpx.ConnectError)))) is None
    assert run(engine().residency(serving({"/api/ps": (200, "garbage")}))) is None
    assert run(engine().residency(serving({"/api/ps": (500, {"error": "x"})}))) is None


def test_timings_from_a_non_streamed_native_body():
    assert engine().timings(load("chat_final.json")) == Timings(
        prompt_tokens=7615, cached_tokens=None, prefill_ms=2735.112345, decode_tokens=12, decode_ms=140.25)


def test_timings_from_the_final_native_frame_and_cache_count_when_stated():
    final = json.loads((DATA / "chat_stream.ndjson").read_text().splitlines()[-1])
    assert engine().timings(final) == Timings(
        prompt_tokens=7615, prefill_ms=19.004, decode_tokens=3, decode_ms=36.1)
    assert engine().timings({**final, "prompt_eval_cached_count": 7614}).cached_tokens == 7614


def test_timings_on_the_openai_dialect_fall_back_to_usage():
    assert engine().timings(load("v1_chat_completion.json")) == Timings(prompt_tokens=7615, decode_tokens=3)
    assert engine().timings({"model": "m", "done": False}) is None
    assert engine().timings({"prompt_eval_count": "x"}) is None


def test_final_frame_of_a_real_native_stream():
    lines = [line.encode() for line in (DATA / "chat_stream.ndjson").read_text().splitlines()]
    e = engine()
    assert e.is_final_frame(NATIVE, lines[-1])
    assert not e.is_final_frame(NATIVE, lines[-2])       # a stream cut before its last line
    assert not e.is_final_frame(NATIVE, lines[-1][:60])  # a last line cut short
    assert not e.is_final_frame(NATIVE, b'{"error":"an error was encountered while running the model"}')


@pytest.mark.parametrize("case", load("errors.json"), ids=lambda c: c["signature"] or "none")
def test_request_error(case):
    assert engine().request_error(case["status"], case["body"]) == case["signature"]
    assert case["signature"] is None or case["signature"] in REQUEST_ERROR_SIGNATURES


def test_request_error_on_other_statuses_and_shapes():
    assert engine().request_error(400, {"error": "no user query found in messages"}) == "no-user-query"
    assert engine().request_error(500, {}) is None
    assert engine().request_error(500, {"error": ["no user query found in messages"]}) is None


def test_recorded_errors_cover_every_signature_and_a_non_verdict():
    assert {c["signature"] for c in load("errors.json")} == {*REQUEST_ERROR_SIGNATURES, None}
