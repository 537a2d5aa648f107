import json
from pathlib import Path

import httpx
import pytest
from hubpool_llamacpp.engine import LlamacppEngine

from hubpool_core import OPENAI, REQUEST_ERROR_SIGNATURES, EngineConfig, ResidentModel, Timings
from hubpool_core.testing import load_installed_engines, mock_http, raising, run

DATA = Path(__file__).parent / "data"
URL = "http://127.0.0.1:8080"


def load(name):
    return json.loads((DATA / name).read_text())


def engine(api_key=None):
    return LlamacppEngine(EngineConfig(base_url=URL, api_key=api_key))


NOT_FOUND = (404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})


def serving(routes, seen=None):
    return mock_http(routes, missing=NOT_FOUND, seen=seen)


def healthy_routes(**override):
    routes = {"/health": (200, load("health.json")), "/v1/models": (200, load("models.json")),
              "/props": (200, load("props.json"))}
    routes.update({"/" + k: v for k, v in override.items()})
    return routes


def test_class_attributes():
    assert LlamacppEngine.kind == "llamacpp"
    assert LlamacppEngine.env_var == "LLAMACPP_URL"
    assert LlamacppEngine.default_url == "http://127.0.0.1:8080"
    assert LlamacppEngine.dialects == frozenset({OPENAI})
    assert LlamacppEngine.openai_prefix == "/v1"
    assert not LlamacppEngine.renders_own_template
    assert LlamacppEngine.states_slots
    assert not LlamacppEngine.has_residency


def test_probe_healthy_reads_window_and_slots():
    seen = []
    result = run(engine(api_key="llama-key").probe(serving(healthy_routes(), seen)))
    assert result.running and result.healthy and result.error is None
    [model] = result.models
    assert model.id == "tiny-llama"
    assert model.context_window == 1024  # the window each slot runs (n_ctx), not the trained 8192
    assert model.size == 464640 and model.owned_by == "llamacpp"
    assert result.slots == 2
    assert {r.url.path for r in seen} == {"/health", "/v1/models", "/props"}
    assert all(r.headers["authorization"] == "Bearer llama-key" for r in seen)


def older_listing():
    """The captured listing as builds before ``meta.n_ctx`` answered it."""
    body = load("models.json")
    del body["data"][0]["meta"]["n_ctx"]
    return body


def test_probe_without_props_falls_back_to_the_listing():
    for props in [(404, {"error": {"code": 404, "message": "File Not Found"}}), (200, "x"), (200, {"total_slots": "2"})]:
        result = run(engine().probe(serving(healthy_routes(props=props))))
        assert result.healthy and result.models[0].context_window == 1024 and result.slots is None
        older = run(engine().probe(serving(healthy_routes(props=props, **{"v1/models": (200, older_listing())}))))
        assert older.healthy and older.models[0].context_window == 8192  # only the trained window is left


def test_slot_count_from_slots_when_props_has_none():
    props = load("props.json")
    del props["total_slots"]
    result = run(engine().probe(serving(healthy_routes(props=(200, props), slots=(200, load("slots.json"))))))
    assert result.healthy and result.slots == 2 and result.models[0].context_window == 1024
    busy = run(engine().probe(serving(healthy_routes(props=(200, props), slots=(200, load("slots_busy.json"))))))
    assert busy.slots == 2  # busy or not, a slot is a slot


def test_probe_while_loading():
    result = run(engine().probe(serving({"/health": (503, load("health_loading.json"))})))
    assert result.running and not result.healthy and result.models == ()
    assert "loading model" in result.error
    old_build = run(engine().probe(serving({"/health": (503, {"status": "loading model"})})))
    assert "loading model" in old_build.error


def test_a_steady_probe_asks_props_alone():
    """Once /props has answered beside a listing, a probe (one per request at
    poolProbeSnapshotTtlMs 0) is one GET: llama-server answers /props only with the model
    loaded, as /health would, and names the model file it lists."""
    probing = engine()
    assert run(probing.probe(serving(healthy_routes()))).healthy  # the first: /health alone, then the rest
    seen = []
    again = run(probing.probe(serving(healthy_routes(), seen)))
    assert again.healthy and again.slots == 2 and again.models[0].context_window == 1024
    assert again.models[0].id == "tiny-llama" and again.models[0].size == 464640
    assert [r.url.path for r in seen] == ["/props"]
    props = load("props.json")
    props["default_generation_settings"]["n_ctx"] = 2048
    props["total_slots"] = 4
    seen = []
    fresh = run(probing.probe(serving(healthy_routes(props=(200, props)), seen)))
    assert [r.url.path for r in seen] == ["/props"]
    assert fresh.slots == 4 and fresh.models[0].context_window == 2048  # what /props says is read live


def started_with(alias, path="/models/other.gguf"):
    listing = load("models.json")
    listing["data"][0]["id"] = alias
    props = load("props.json")
    props["model_alias"], props["model_path"] = alias, path
    return healthy_routes(props=(200, props), **{"v1/models": (200, listing)})


def test_a_server_restarted_with_another_model_is_listed_again_in_the_same_probe():
    probing = engine()
    assert run(probing.probe(serving(healthy_routes()))).healthy
    assert run(probing.probe(serving(healthy_routes()))).healthy
    seen = []
    swapped = run(probing.probe(serving(started_with("other-model"), seen)))
    assert swapped.healthy and [m.id for m in swapped.models] == ["other-model"]
    assert [r.url.path for r in seen] == ["/props", "/v1/models"]
    seen = []
    assert [m.id for m in run(probing.probe(serving(started_with("other-model"), seen))).models] == ["other-model"]
    assert [r.url.path for r in seen] == ["/props"]
    # the same file under another alias, and the same alias for another file, are other servers
    for routes in (started_with("renamed"), started_with("renamed", path="/models/third.gguf")):
        seen = []
        assert [m.id for m in run(probing.probe(serving(routes, seen))).models] == ["renamed"]
        assert sorted(r.url.path for r in seen) == ["/props", "/v1/models"]
    upgraded = engine()  # the same model on another build: listed again too
    assert run(upgraded.probe(serving(healthy_routes()))).healthy
    props = load("props.json")
    props["build_info"] = "b2-upgraded"
    seen = []
    assert run(upgraded.probe(serving(healthy_routes(props=(200, props)), seen))).models[0].id == "tiny-llama"
    assert sorted(r.url.path for r in seen) == ["/props", "/v1/models"]


def test_props_that_names_no_model_has_the_listing_read_every_time():
    """Router mode and older builds: /props names no model file or alias, so nothing says the
    listing still holds."""
    props = load("props.json")
    del props["model_alias"], props["model_path"]
    routes = healthy_routes(props=(200, props))
    probing = engine()
    assert run(probing.probe(serving(routes))).healthy
    for _ in range(2):
        seen = []
        assert run(probing.probe(serving(routes, seen))).healthy
        assert sorted(r.url.path for r in seen) == ["/props", "/v1/models"]


def test_a_listing_is_reused_for_a_bounded_time(monkeypatch):
    import hubpool_llamacpp.engine as module

    now = [1000.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: now[0])
    probing = engine()
    assert run(probing.probe(serving(healthy_routes()))).healthy
    now[0] += module.LISTING_REUSE_S - 1
    seen = []
    assert run(probing.probe(serving(healthy_routes(), seen))).healthy
    assert [r.url.path for r in seen] == ["/props"]  # reusing does not extend the bound
    now[0] += 2
    seen = []
    assert run(probing.probe(serving(healthy_routes(), seen))).healthy
    assert sorted(r.url.path for r in seen) == ["/props", "/v1/models"]


def test_a_server_that_went_away_is_listed_afresh_when_it_is_back():
    probing = engine()
    assert run(probing.probe(serving(healthy_routes()))).healthy
    assert not run(probing.probe(mock_http(raising(httpx.ConnectError)))).healthy
    assert run(probing.probe(serving(healthy_routes()))).healthy  # /health alone first, then the rest
    seen = []
    assert run(probing.probe(serving(healthy_routes(), seen))).healthy
    assert [r.url.path for r in seen] == ["/props"]
    loading = (503, load("health_loading.json"))
    assert not run(probing.probe(serving(healthy_routes(health=loading, props=loading)))).healthy
    seen = []
    assert run(probing.probe(serving(healthy_routes(), seen))).healthy
    assert "/v1/models" in {r.url.path for r in seen}  # loaded again, and listed again


def test_a_steady_probe_of_a_server_reloading_judges_health():
    """Restarted with another model and loading it: llama-server lets the listing through and
    answers /props and /health 503 "Loading model"; the probe asks /health and says so."""
    probing = engine()
    assert run(probing.probe(serving(healthy_routes()))).healthy
    loading = (503, load("health_loading.json"))
    seen = []
    result = run(probing.probe(serving(healthy_routes(health=loading, props=loading), seen)))
    assert result.running and not result.healthy and "loading model" in result.error
    assert "/health" in {r.url.path for r in seen}
    back = run(probing.probe(serving(healthy_routes())))  # loaded: /props answers again
    assert back.healthy


def test_a_build_without_props_keeps_asking_health_beside_the_listing():
    probing = engine()
    routes = healthy_routes(props=NOT_FOUND)
    assert run(probing.probe(serving(routes))).healthy
    seen = []
    again = run(probing.probe(serving(routes, seen)))
    assert again.healthy and again.models[0].context_window == 1024
    assert sorted(r.url.path for r in seen) == ["/health", "/props", "/v1/models"]  # one round trip
    down = run(probing.probe(serving(healthy_routes(props=NOT_FOUND, health=(500, {"error": "boom"})))))
    assert not down.healthy


def test_probe_other_503():
    result = run(engine().probe(serving({"/health": (503, {"error": {"message": "no slot available"}})})))
    assert result.running and not result.healthy and "no slot available" in result.error


def test_probe_engine_down():
    result = run(engine().probe(mock_http(raising(httpx.ConnectError))))
    assert not result.running and not result.healthy
    assert result.error == f"connection refused at {URL} (is llama-server running? set LLAMACPP_URL)"


def test_probe_of_a_server_that_names_another_engine():
    load_installed_engines()  # the other engines, as a node imports them
    body = {"object": "list", "data": [{"id": "Qwen/Qwen3-8B", "object": "model", "owned_by": "vllm",
                                        "max_model_len": 32768}]}
    result = run(engine().probe(serving(healthy_routes(**{"v1/models": (200, body)}))))
    assert result.running and not result.healthy and "is vLLM, not llama-server" in result.error


@pytest.mark.parametrize("override", [{"health": (401, {"error": {"message": "Invalid API Key"}})},
                                      {"v1/models": (200, "<html>")}, {"v1/models": (200, {"data": 3})},
                                      {"health": (500, "")}])
def test_probe_nonsense_is_unhealthy(override):
    result = run(engine().probe(serving(healthy_routes(**override))))
    assert result.running and not result.healthy and result.error


def test_residency_is_the_model_it_was_started_with():
    assert run(engine().residency(serving(healthy_routes()))) == [
        ResidentModel(id="tiny-llama", context_window=1024)]
    assert run(engine().residency(mock_http(raising(httpx.ConnectError)))) is None
    assert run(engine().residency(serving({"/health": (503, load("health_loading.json"))}))) is None


def test_timings_count_the_cache():
    # the captured prompt was sent twice: the second read 1 token and took 287 from the cache
    assert engine().timings(load("chat_completion.json")) == Timings(
        prompt_tokens=288, cached_tokens=287, prefill_ms=0.672, decode_tokens=4, decode_ms=0.956)


def test_timings_without_cache_n_or_timings():
    body = {"usage": {"prompt_tokens": 900, "completion_tokens": 2},
            "timings": {"prompt_n": 900, "prompt_ms": 80.5, "predicted_n": 2, "predicted_ms": 30}}
    assert engine().timings(body) == Timings(prompt_tokens=900, prefill_ms=80.5, decode_tokens=2, decode_ms=30.0)
    assert engine().timings({"usage": {"prompt_tokens": 5}}) == Timings(prompt_tokens=5)
    assert engine().timings({"timings": "x"}) is None
    assert engine().timings({"timings": {}}) is None


def test_final_frame_and_timings_of_a_real_stream():
    frames = [line[len("data: "):].encode() for line in (DATA / "chat_stream.txt").read_text().splitlines()
              if line.startswith("data: ")]
    e = engine()
    assert e.is_final_frame(OPENAI, frames[-1])
    assert e.is_final_frame(OPENAI, frames[-2])
    assert not e.is_final_frame(OPENAI, frames[1])       # a stream cut before the finish
    assert not e.is_final_frame(OPENAI, frames[-2][:50])  # the last line cut short
    # this build sends no usage in a stream unless asked: timings alone give the whole prompt
    assert "usage" not in json.loads(frames[-2])
    assert e.timings(json.loads(frames[-2])) == Timings(
        prompt_tokens=288, cached_tokens=287, prefill_ms=0.753, decode_tokens=4, decode_ms=2.061)


@pytest.mark.parametrize("case", load("errors.json"), ids=lambda c: c["signature"] or "none")
def test_request_error(case):
    assert engine().request_error(case["status"], case["body"]) == case["signature"]
    assert case["signature"] is None or case["signature"] in REQUEST_ERROR_SIGNATURES


def test_request_error_without_a_message():
    assert engine().request_error(500, {"error": {"code": 500}}) is None
    assert engine().request_error(503, load("health_loading.json")) is None


def test_recorded_errors_cover_every_signature_and_a_non_verdict():
    assert {c["signature"] for c in load("errors.json")} == {*REQUEST_ERROR_SIGNATURES, None}


@pytest.mark.parametrize("case", load("errors_captured.json"), ids=lambda c: c["signature"])
def test_request_error_of_the_captured_refusals(case):
    # today's llama-server answers these with 400, which the relay passes back as the
    # request's fault without asking; a build or relay answering 500 is classified the same
    assert case["status"] == 400
    assert engine().request_error(500, case["body"]) == case["signature"]


# -- engine-reported queue depth (poolEngineQueueDepth) ----------------------------------


def metrics(name):
    return (DATA / name).read_text()


def test_queue_depth_from_metrics_counts_processing_and_deferred():
    seen = []
    http = serving({"/metrics": (200, metrics("metrics_busy.txt"))}, seen)
    assert run(engine(api_key="llama-key").queue_depth(http)) == 3  # 2 in the slots + 1 deferred
    assert [r.url.path for r in seen] == ["/metrics"]
    assert seen[0].headers["authorization"] == "Bearer llama-key"
    assert run(engine().queue_depth(serving({"/metrics": (200, metrics("metrics_idle.txt"))}))) == 0


def test_queue_depth_without_metrics_counts_busy_slots():
    # started without --metrics, llama-server answers /metrics 501; /slots still says who is busy
    no_metrics = (501, {"error": {"code": 501, "message": "This server does not support metrics endpoint.",
                                  "type": "not_supported_error"}})
    busy = serving({"/metrics": no_metrics, "/slots": (200, load("slots_busy.json"))})
    assert run(engine().queue_depth(busy)) == 2
    idle = serving({"/metrics": no_metrics, "/slots": (200, load("slots.json"))})
    assert run(engine().queue_depth(idle)) == 0


@pytest.mark.parametrize("routes", [
    {},                                                          # neither endpoint
    {"/metrics": (200, "python_gc_objects_collected_total 1\n")},  # text without the gauges
    {"/metrics": (200, "{not prometheus"), "/slots": (200, {"slots": 2})},
    {"/slots": (200, "x")},
])
def test_queue_depth_none_when_the_engine_offers_no_figure(routes):
    assert run(engine().queue_depth(serving(routes))) is None


def test_queue_depth_none_when_down():
    assert run(engine().queue_depth(mock_http(raising(httpx.ConnectError)))) is None
