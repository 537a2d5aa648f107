import json
from pathlib import Path

import httpx
import pytest
from hubpool_omlx.engine import OmlxEngine

from hubpool_core import OPENAI, REQUEST_ERROR_SIGNATURES, EngineConfig, Timings
from hubpool_core.testing import load_installed_engines, mock_http, raising, run

DATA = Path(__file__).parent / "data"
URL = "http://127.0.0.1:8000"


def load(name):
    return json.loads((DATA / name).read_text())


def engine(api_key=None):
    return OmlxEngine(EngineConfig(base_url=URL, api_key=api_key))


def serving(routes, seen=None):
    return mock_http(routes, missing=(404, {"detail": "Not Found"}), seen=seen)


def test_class_attributes():
    assert OmlxEngine.kind == "omlx"
    assert OmlxEngine.env_var == "OMLX_URL"
    assert OmlxEngine.default_url == "http://127.0.0.1:8000"
    assert OmlxEngine.dialects == frozenset({OPENAI})
    assert OmlxEngine.openai_prefix == "/v1"
    assert not OmlxEngine.renders_own_template
    assert not OmlxEngine.states_slots
    assert not OmlxEngine.has_residency


def test_probe_healthy_reads_window_when_stated():
    seen = []
    result = run(engine(api_key="omlx-key").probe(serving({"/v1/models": (200, load("models.json"))}, seen)))
    assert result.running and result.healthy and result.error is None
    assert [(m.id, m.context_window, m.owned_by) for m in result.models] == [
        ("Qwen3-30B-A3B-4bit", 40960, "omlx"), ("gemma-3-12b-it-qat-4bit", None, "omlx")]
    assert seen[0].headers["authorization"] == "Bearer omlx-key"


def test_probe_engine_down():
    result = run(engine().probe(mock_http(raising(httpx.ConnectError))))
    assert not result.running and not result.healthy
    assert result.error == f"connection refused at {URL} (is oMLX running? set OMLX_URL)"


def test_probe_of_vllm_on_port_8000_names_it():
    load_installed_engines()  # the other engines, as a node imports them
    result = run(engine().probe(serving({"/v1/models": (200, load("models_vllm.json"))})))
    assert result.running and not result.healthy and result.models == ()
    assert result.error.startswith(f"the server at {URL} is vLLM, not oMLX")


def test_probe_of_server_that_names_no_engine_is_left_alone():
    body = {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "system"}]}
    result = run(engine().probe(serving({"/v1/models": (200, body)})))
    assert result.healthy and [m.id for m in result.models] == ["m"]


@pytest.mark.parametrize("answer", [(200, "not json"), (200, {"data": "x"}), (503, {"detail": "busy"})])
def test_probe_nonsense_is_unhealthy(answer):
    result = run(engine().probe(serving({"/v1/models": answer})))
    assert result.running and not result.healthy and result.error


def test_no_residency_api():
    assert OmlxEngine.has_residency is False
    assert run(engine().residency(mock_http(raising(httpx.ConnectError)))) is None


def test_timings_and_final_frame_of_a_real_stream():
    frames = [line[len("data: "):].encode() for line in (DATA / "chat_stream.txt").read_text().splitlines()
              if line.startswith("data: ")]
    e = engine()
    assert e.is_final_frame(OPENAI, frames[-1])
    assert e.is_final_frame(OPENAI, frames[-2])
    assert not e.is_final_frame(OPENAI, frames[1])  # a stream cut before the finish
    assert e.timings(json.loads(frames[-2])) == Timings(prompt_tokens=412, cached_tokens=384, decode_tokens=3)


@pytest.mark.parametrize("case", load("errors.json"), ids=lambda c: c["signature"] or "none")
def test_request_error(case):
    assert engine().request_error(case["status"], case["body"]) == case["signature"]
    assert case["signature"] is None or case["signature"] in REQUEST_ERROR_SIGNATURES


@pytest.mark.parametrize("body", [{}, {"detail": [{"loc": ["body", "messages"]}]}, None, 7])
def test_request_error_without_a_message(body):
    assert engine().request_error(500, body) is None


def test_recorded_errors_cover_every_signature_and_a_non_verdict():
    assert {c["signature"] for c in load("errors.json")} == {*REQUEST_ERROR_SIGNATURES, None}
