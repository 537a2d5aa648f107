import json
from pathlib import Path

import httpx
import pytest
from hubpool_vllm.engine import VllmEngine
from hypothesis import given, settings
from hypothesis import strategies as st

from hubpool_core import OPENAI, REQUEST_ERROR_SIGNATURES, EngineConfig, Timings
from hubpool_core.testing import load_installed_engines, mock_http, raising, run

DATA = Path(__file__).parent / "data"
URL = "http://127.0.0.1:8000"


def load(name):
    return json.loads((DATA / name).read_text())


def engine(api_key=None, source="default"):
    return VllmEngine(EngineConfig(base_url=URL + "/", api_key=api_key, source=source))


def serving(routes, seen=None):
    return mock_http(routes, missing=(404, {"detail": "Not Found"}), seen=seen)


def test_class_attributes():
    assert VllmEngine.kind == "vllm"
    assert VllmEngine.env_var == "VLLM_URL"
    assert VllmEngine.default_url == "http://127.0.0.1:8000"
    assert VllmEngine.dialects == frozenset({OPENAI})
    assert VllmEngine.openai_prefix == "/v1"
    assert not VllmEngine.renders_own_template
    assert not VllmEngine.states_slots
    assert not VllmEngine.has_residency


def test_probe_healthy_reads_window():
    result = run(engine().probe(serving({"/v1/models": (200, load("models.json"))})))
    assert result.running and result.healthy and result.error is None
    [model] = result.models
    assert model.id == "Qwen/Qwen3-8B"
    assert model.context_window == 32768
    assert model.owned_by == "vllm"
    assert result.slots is None


def test_probe_engine_down():
    result = run(engine().probe(mock_http(raising(httpx.ConnectError))))
    assert not result.running and not result.healthy and result.models == ()
    assert result.error == f"connection refused at {URL} (is vLLM running? set VLLM_URL)"


def test_probe_engine_down_with_url_from_env():
    result = run(engine(source="VLLM_URL").probe(mock_http(raising(httpx.ConnectError))))
    assert "VLLM_URL points here" in result.error


def test_probe_connect_timeout_is_not_running():
    result = run(engine().probe(mock_http(raising(httpx.ConnectTimeout))))
    assert not result.running and not result.healthy


def test_probe_read_timeout_is_running_but_unhealthy():
    result = run(engine().probe(mock_http(raising(httpx.ReadTimeout))))
    assert result.running and not result.healthy and "in time" in result.error


def test_probe_of_omlx_on_port_8000_names_it():
    load_installed_engines()  # the other engines, as a node imports them
    result = run(engine().probe(serving({"/v1/models": (200, load("models_omlx.json"))})))
    assert result.running and not result.healthy and result.models == ()
    assert result.error.startswith(f"the server at {URL} is oMLX, not vLLM")


@pytest.mark.parametrize("owner,label", [("llamacpp", "llama-server"), ("lemonade", "Lemonade"),
                                         ("library", "Ollama")])
def test_probe_of_other_named_engines(owner, label):
    load_installed_engines()  # the other engines, as a node imports them
    body = {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": owner}]}
    result = run(engine().probe(serving({"/v1/models": (200, body)})))
    assert not result.healthy and f"is {label}, not vLLM" in result.error


def test_probe_of_server_that_names_no_engine_is_left_alone():
    result = run(engine().probe(serving({"/v1/models": (200, load("models_unnamed.json"))})))
    assert result.healthy and [m.id for m in result.models] == ["Qwen/Qwen3-8B"]
    assert result.models[0].context_window is None


def test_probe_sends_the_key():
    seen = []
    run(engine(api_key="sk-test").probe(serving({"/v1/models": (200, load("models.json"))}, seen)))
    assert seen[0].headers["authorization"] == "Bearer sk-test"


def test_probe_key_refused():
    body = {"error": "Unauthorized"}
    result = run(engine(api_key="sk-wrong").probe(serving({"/v1/models": (401, body)})))
    assert result.running and not result.healthy and "refused this node's API key" in result.error
    result = run(engine().probe(serving({"/v1/models": (401, body)})))
    assert "holds none" in result.error


@pytest.mark.parametrize("answer", [(200, "<html>nginx</html>"), (200, {"models": []}),
                                    (200, [1, 2]), (500, {"error": "x"}), (404, "")])
def test_probe_nonsense_is_unhealthy_never_raises(answer):
    result = run(engine().probe(serving({"/v1/models": answer})))
    assert result.running and not result.healthy and result.error


def test_probe_skips_malformed_entries():
    body = {"data": [{"id": "ok", "owned_by": "vllm", "max_model_len": True}, {"id": 3}, "x", None]}
    result = run(engine().probe(serving({"/v1/models": (200, body)})))
    assert result.healthy and [(m.id, m.context_window) for m in result.models] == [("ok", None)]


def test_no_residency_api():
    assert run(engine().residency(mock_http(raising(httpx.ConnectError)))) is None


def test_timings_from_usage():
    assert engine().timings(load("chat_completion.json")) == Timings(
        prompt_tokens=1843, cached_tokens=1792, decode_tokens=4)
    assert engine().timings({"choices": []}) is None


def test_final_frame_of_a_real_stream():
    frames = [line[len("data: "):].encode() for line in (DATA / "chat_stream.txt").read_text().splitlines()
              if line.startswith("data: ")]
    e = engine()
    assert e.is_final_frame(OPENAI, frames[-1])          # [DONE]
    assert e.is_final_frame(OPENAI, frames[2])           # finish_reason "stop"
    assert not e.is_final_frame(OPENAI, frames[1])       # a stream cut after a content chunk
    assert not e.is_final_frame(OPENAI, frames[2][:40])  # a line cut mid-frame


@pytest.mark.parametrize("case", load("errors.json"), ids=lambda c: c["signature"] or "none")
def test_request_error(case):
    assert engine().request_error(case["status"], case["body"]) == case["signature"]


@pytest.mark.parametrize("body", [{}, {"error": None}, {"error": {"message": 5}}, [], "text", None,
                                  {"detail": [{"msg": "Field required"}]}])
def test_request_error_without_a_message(body):
    assert engine().request_error(500, body) is None


json_ish = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
messages = st.one_of(st.text(), st.sampled_from([
    "No user query found in messages.", "maximum context length is 9 tokens", "jinja2.exceptions.X"]))


@settings(max_examples=300, deadline=None)
@given(status=st.integers(min_value=0, max_value=999),
       body=st.one_of(json_ish, st.builds(lambda m: {"error": m}, messages),
                      st.builds(lambda m: {"error": {"message": m}}, messages),
                      st.builds(lambda m: {"object": "error", "message": m}, messages)))
def test_request_error_never_raises(status, body):
    assert engine().request_error(status, body) in (None, *REQUEST_ERROR_SIGNATURES)


def test_recorded_errors_cover_every_signature_and_a_non_verdict():
    assert {c["signature"] for c in load("errors.json")} == {*REQUEST_ERROR_SIGNATURES, None}


# -- engine-reported queue depth (poolEngineQueueDepth) ----------------------------------


def metrics(name):
    return (DATA / name).read_text()


def test_queue_depth_is_running_plus_waiting_from_metrics():
    seen = []
    http = serving({"/metrics": (200, metrics("metrics_busy.txt"))}, seen)
    assert run(engine(api_key="vk").queue_depth(http)) == 5  # 3 running + 2 waiting
    assert [r.url.path for r in seen] == ["/metrics"]
    assert seen[0].headers["authorization"] == "Bearer vk"


def test_queue_depth_idle_is_zero_not_none():
    assert run(engine().queue_depth(serving({"/metrics": (200, metrics("metrics_idle.txt"))}))) == 0


def test_queue_depth_reads_neither_the_by_reason_gauge_nor_a_lookalike():
    # waiting_by_reason repeats the waiting requests; counting it would double them
    text = metrics("metrics_busy.txt").replace('reason="capacity"} 2.0', 'reason="capacity"} 40.0')
    assert run(engine().queue_depth(serving({"/metrics": (200, text)}))) == 5


def test_queue_depth_sums_every_engine_and_model_label():
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="a"} 2.0\n'
        'vllm:num_requests_running{engine="1",model_name="a"} 1.0\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="a"} 4.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="a"} 0.0\n'
    )
    assert run(engine().queue_depth(serving({"/metrics": (200, text)}))) == 7


@pytest.mark.parametrize("route", [
    (404, {"detail": "Not Found"}),                          # metrics disabled or another server
    (200, "python_gc_objects_collected_total 12.0\n"),      # Prometheus text without the gauges
    (200, "this is { not prometheus"),
    (500, "boom"),
])
def test_queue_depth_none_when_metrics_say_nothing(route):
    assert run(engine().queue_depth(serving({"/metrics": route}))) is None


def test_queue_depth_none_when_down():
    assert run(engine().queue_depth(mock_http(raising(httpx.ConnectError)))) is None
    assert run(engine().queue_depth(mock_http(raising(httpx.ReadTimeout)))) is None
