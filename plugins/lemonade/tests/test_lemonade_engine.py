import json
from pathlib import Path

import httpx
import pytest
from hubpool_lemonade.engine import LemonadeEngine

from hubpool_core import OPENAI, REQUEST_ERROR_SIGNATURES, EngineConfig, ResidentModel, Timings
from hubpool_core.testing import mock_http, raising, run

DATA = Path(__file__).parent / "data"
URL = "http://127.0.0.1:13305"


def load(name):
    return json.loads((DATA / name).read_text())


def engine(api_key=None):
    return LemonadeEngine(EngineConfig(base_url=URL, api_key=api_key))


def serving(routes, seen=None):
    return mock_http(routes, missing=(404, {"error": {"message": "Not Found"}}), seen=seen)


ROUTES = {"/api/v1/health": (200, load("health.json")), "/api/v1/models": (200, load("models.json"))}


def test_class_attributes():
    assert LemonadeEngine.kind == "lemonade"
    assert LemonadeEngine.env_var == "LEMONADE_URL"
    assert LemonadeEngine.default_url == "http://127.0.0.1:13305"
    assert LemonadeEngine.dialects == frozenset({OPENAI})
    assert LemonadeEngine.openai_prefix == "/api/v1"
    assert not LemonadeEngine.renders_own_template
    assert not LemonadeEngine.states_slots
    assert LemonadeEngine.has_residency


def test_openai_routes_live_under_api_v1():
    assert engine().upstream_path(OPENAI, "/v1/chat/completions") == "/api/v1/chat/completions"


def test_probe_healthy_states_the_loaded_window():
    seen = []
    result = run(engine(api_key="lemon").probe(serving(ROUTES, seen)))
    assert result.running and result.healthy and result.error is None and result.slots is None
    assert [(m.id, m.context_window, m.owned_by) for m in result.models] == [
        ("Qwen3.6-27B-GGUF", 65536, "lemonade"),
        ("Qwen3-0.6B-GGUF", None, "lemonade"),              # downloaded, not loaded: no window
        ("nomic-embed-text-v2-moe-GGUF", None, "lemonade"),  # loaded without a saved ctx_size
    ]
    assert all(r.headers["authorization"] == "Bearer lemon" for r in seen)


def test_probe_engine_down():
    result = run(engine().probe(mock_http(raising(httpx.ConnectError))))
    assert not result.running and not result.healthy
    assert result.error == f"connection refused at {URL} (is Lemonade running? set LEMONADE_URL)"


@pytest.mark.parametrize("routes", [
    {"/api/v1/health": (404, "Not Found")},                                # another server on the port
    {"/api/v1/health": (200, {"status": "ok"})},                          # not Lemonade's health
    {**ROUTES, "/api/v1/models": (200, {"models": []})},
    {**ROUTES, "/api/v1/models": (401, {"error": {"message": "Invalid API key"}})},
])
def test_probe_nonsense_is_unhealthy(routes):
    result = run(engine().probe(serving(routes)))
    assert result.running and not result.healthy and result.error


def test_residency_from_health():
    assert run(engine().residency(serving(ROUTES))) == [
        ResidentModel(id="Qwen3.6-27B-GGUF", context_window=65536),
        ResidentModel(id="nomic-embed-text-v2-moe-GGUF"),
    ]
    assert run(engine().residency(serving({"/api/v1/health": (200, load("health_idle.json"))}))) == []


def test_residency_of_an_older_build_and_unreadable():
    older = {"status": "ok", "model_loaded": "Qwen3-0.6B-GGUF"}
    assert run(engine().residency(serving({"/api/v1/health": (200, older)}))) == [
        ResidentModel(id="Qwen3-0.6B-GGUF")]
    assert run(engine().residency(mock_http(raising(httpx.ConnectError)))) is None
    assert run(engine().residency(serving({"/api/v1/health": (200, {"status": "ok"})}))) is None


def test_final_frame_and_timings_of_a_real_stream():
    frames = [line[len("data: "):].encode() for line in (DATA / "chat_stream.txt").read_text().splitlines()
              if line.startswith("data: ")]
    e = engine()
    assert e.is_final_frame(OPENAI, frames[-1])
    assert e.is_final_frame(OPENAI, frames[-2])
    assert not e.is_final_frame(OPENAI, frames[0])  # a stream cut before the finish
    assert e.timings(json.loads(frames[-2])) == Timings(prompt_tokens=3021, cached_tokens=2900, decode_tokens=2)


@pytest.mark.parametrize("case", load("errors.json"), ids=lambda c: c["signature"] or "none")
def test_request_error(case):
    assert engine().request_error(case["status"], case["body"]) == case["signature"]
    assert case["signature"] is None or case["signature"] in REQUEST_ERROR_SIGNATURES


def test_request_error_without_a_message():
    assert engine().request_error(500, {"error": {}}) is None
    assert engine().request_error(500, None) is None


def test_recorded_errors_cover_every_signature_and_a_non_verdict():
    assert {c["signature"] for c in load("errors.json")} == {*REQUEST_ERROR_SIGNATURES, None}
