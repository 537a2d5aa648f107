"""Every fault, in every flavor's words, and the controls that arm and clear them."""

from __future__ import annotations

import httpx
import pytest

from hubpool_sim import SimConfig, SimModel, parse_fault, run_in_thread
from hubpool_sim.faults import Fault
from hubpool_sim.testing import ndjson_lines, sse_events, wait_until

CHAT = "llama3.2:3b"
PREFIX = {"ollama": "/v1", "vllm": "/v1", "llamacpp": "/v1", "lemonade": "/api/v1", "omlx": "/v1"}
MESSAGES = [{"role": "user", "content": "hi"}]

VERDICT_TEXT = {
    ("ollama", "no-user-query"): "no user query found in messages",
    ("vllm", "no-user-query"): "No user query found in messages.",
    ("llamacpp", "no-user-query"): "No user query found in messages.",
    ("ollama", "missing-messages"): "messages are required",
    ("vllm", "missing-messages"): "messages is required",
    ("llamacpp", "missing-messages"): "'messages' is required",
    ("lemonade", "missing-messages"): "'messages' is required",
    ("omlx", "missing-messages"): "messages is required",
    ("ollama", "invalid-message"): "invalid message format",
    ("llamacpp", "invalid-message"): "Missing 'content' in message",
    ("lemonade", "invalid-message"): "Missing 'content' in message",
    ("ollama", "context-length"): "the input length exceeds the context length",
    ("vllm", "context-length"): (
        "This model's maximum context length is 4096 tokens. However, you requested 4097 tokens "
        "(4097 in the messages, 0 in the completion). Please reduce the length of the messages or completion."
    ),
    ("llamacpp", "context-length"): "the request exceeds the available context size, try increasing it",
    ("ollama", "chat-template"): 'template: :1:12: executing "" at <.Messages>: error calling index: index out of range',
    ("vllm", "chat-template"): "Error rendering chat template: jinja2.exceptions.UndefinedError: list object has no element 0",
    ("omlx", "chat-template"): "Error rendering chat template: list object has no element 0",
}


def shape(flavor: str, status: int, message: str, native: bool = False) -> dict:
    types = {"vllm": {500: "InternalServerError", 503: "ServiceUnavailableError", 401: "AuthenticationError"},
             "ollama": {500: "api_error", 503: "api_error", 401: "authentication_error"}}
    kind = types.get(flavor, {500: "server_error", 503: "unavailable_error", 401: "authentication_error"})[status]
    if flavor == "ollama":
        return {"error": message} if native else {"error": {"message": message, "type": kind, "param": None, "code": None}}
    if flavor == "vllm":
        return {"object": "error", "message": message, "type": kind, "param": None, "code": status}
    if flavor == "llamacpp":
        return {"error": {"code": status, "message": message, "type": kind}}
    if flavor == "lemonade":
        return {"error": {"message": message, "type": kind}}
    return {"error": {"message": message, "type": kind, "code": status}}


@pytest.mark.parametrize(("flavor", "verdict"), sorted(VERDICT_TEXT))
def test_verdicts_in_each_flavors_words(flavor, verdict):
    cfg = SimConfig(flavor=flavor, models=[SimModel(CHAT, window=4096)], faults=[f"verdict:{verdict}"])
    with run_in_thread(cfg) as sim:
        response = httpx.post(sim.url + PREFIX[flavor] + "/chat/completions", json={"model": CHAT, "messages": MESSAGES})
        native = httpx.post(sim.url + "/api/chat", json={"model": CHAT, "messages": MESSAGES}) if flavor == "ollama" else None
    assert response.status_code == 500
    assert response.json() == shape(flavor, 500, VERDICT_TEXT[flavor, verdict])
    if native is not None:
        assert (native.status_code, native.json()) == (500, {"error": VERDICT_TEXT[flavor, verdict]})


@pytest.mark.parametrize("flavor", ["ollama", "vllm", "llamacpp", "lemonade", "omlx"])
def test_error_status_and_unauthorized_faults(flavor):
    with run_in_thread(SimConfig(flavor=flavor)) as sim:
        sim.add_fault("error:503", count=1)
        sim.add_fault("unauthorized", count=1)
        busy = httpx.post(sim.url + PREFIX[flavor] + "/chat/completions", json={"model": CHAT, "messages": MESSAGES})
        refused = httpx.post(sim.url + PREFIX[flavor] + "/chat/completions", json={"model": CHAT, "messages": MESSAGES})
        fine = httpx.post(sim.url + PREFIX[flavor] + "/chat/completions", json={"model": CHAT, "messages": MESSAGES})
        assert sim.stats()["faults_served"] == 2
    assert busy.status_code == 503
    assert busy.json() == shape(flavor, 503, "simulated fault: HTTP 503 Service Unavailable")
    unauthorized = {"ollama": "unauthorized", "vllm": "Unauthorized", "llamacpp": "Invalid API Key"}.get(flavor, "Invalid API key")
    assert refused.status_code == 401 and refused.json() == shape(flavor, 401, unauthorized)
    assert fine.status_code == 200


def test_cut_streams_end_without_their_final_frame():
    with run_in_thread(SimConfig(faults=["cut"])) as sim:
        native = ndjson_lines(httpx.post(sim.url + "/api/chat", json={"model": CHAT, "messages": MESSAGES}).text)
        openai = sse_events(httpx.post(sim.url + "/v1/chat/completions",
                                       json={"model": CHAT, "messages": MESSAGES, "stream": True}).text)
        native_plain = httpx.post(sim.url + "/api/chat", json={"model": CHAT, "messages": MESSAGES, "stream": False}).json()
        openai_plain = httpx.post(sim.url + "/v1/chat/completions", json={"model": CHAT, "messages": MESSAGES}).json()
        stats = sim.stats()
    assert len(native) == 4 and all(line["done"] is False for line in native)
    assert len(openai) == 4 and "[DONE]" not in openai
    assert all(e["choices"][0]["finish_reason"] is None for e in openai)
    assert native_plain["done"] is False and "done_reason" not in native_plain
    assert native_plain["message"]["content"] == "tok0 tok1 tok2 tok3"
    assert openai_plain["choices"][0]["finish_reason"] is None
    assert stats["completed"] == 4 and stats["faults_served"] == 4


def test_unused_placeholders():
    with run_in_thread(SimConfig(flavor="ollama", faults=["unused@:1"])) as sim:
        body = httpx.post(sim.url + "/api/generate", json={"model": CHAT, "prompt": "hi", "stream": False}).json()
        after = httpx.post(sim.url + "/api/generate", json={"model": CHAT, "prompt": "hi", "stream": False}).json()
    assert body["response"] == "<unused49>" * 8 and body["done"] is True
    assert after["response"].startswith("tok0")


def test_hang_sends_nothing_and_counts_the_hang_up():
    with run_in_thread(SimConfig(flavor="vllm", faults=["hang@:1"])) as sim:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(sim.url + "/v1/chat/completions", json={"model": CHAT, "messages": MESSAGES}, timeout=0.3)
        assert wait_until(lambda: sim.stats()["aborted"] == 1)
        assert httpx.post(sim.url + "/v1/chat/completions", json={"model": CHAT, "messages": MESSAGES}).status_code == 200


def test_hang_does_not_block_shutdown():
    import threading
    import time

    with run_in_thread(SimConfig(faults=["hang"])) as sim:
        client = threading.Thread(target=lambda: _swallow(lambda: httpx.post(
            sim.url + "/api/chat", json={"model": CHAT, "messages": MESSAGES}, timeout=5)), daemon=True)
        client.start()
        assert wait_until(lambda: sim.stats()["requests"] == 1)
        started = time.monotonic()
    assert time.monotonic() - started < 2.0


def _swallow(call):
    try:
        call()
    except httpx.HTTPError:
        pass


def test_drop_resets_the_connection_mid_body():
    with run_in_thread(SimConfig(flavor="vllm", faults=["drop@:2"])) as sim:
        received = []
        with pytest.raises(httpx.RemoteProtocolError):
            with httpx.stream("POST", sim.url + "/v1/chat/completions",
                              json={"model": CHAT, "messages": MESSAGES, "stream": True}) as response:
                assert response.status_code == 200
                for chunk in response.iter_bytes():
                    received.append(chunk)
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.post(sim.url + "/v1/chat/completions", json={"model": CHAT, "messages": MESSAGES})
        assert wait_until(lambda: sim.stats()["dropped"] == 2)
        stats = sim.stats()
    events = sse_events(b"".join(received).decode())
    assert 1 <= len(events) <= 4 and "[DONE]" not in events
    assert stats["aborted"] == 0 and stats["faults_served"] == 2


def test_faults_limited_by_model_count_and_path():
    models = [SimModel("qwen3:8b"), SimModel("gemma4:e4b")]
    with run_in_thread(SimConfig(flavor="vllm", models=models)) as sim:
        sim.add_fault("verdict:no-user-query@gemma4:e4b:1")
        sim.add_fault({"fault": "error:503", "path": "/health", "count": 1})
        other = httpx.post(sim.url + "/v1/chat/completions", json={"model": "qwen3:8b", "messages": MESSAGES})
        hit = httpx.post(sim.url + "/v1/chat/completions", json={"model": "gemma4:e4b", "messages": MESSAGES})
        cleared = httpx.post(sim.url + "/v1/chat/completions", json={"model": "gemma4:e4b", "messages": MESSAGES})
        health = [httpx.get(sim.url + "/health").status_code for _ in range(2)]
        models_listing = httpx.get(sim.url + "/v1/models").status_code  # listings are not inference routes
    assert (other.status_code, hit.status_code, cleared.status_code) == (200, 500, 200)
    assert health == [503, 200] and models_listing == 200


def test_fault_controls_over_http():
    with run_in_thread(SimConfig(flavor="omlx")) as sim:
        added = httpx.post(sim.url + "/_sim/faults", json={"fault": "error:500", "model": CHAT, "count": 3}).json()
        listed = httpx.get(sim.url + "/_sim/faults").json()
        bad = httpx.post(sim.url + "/_sim/faults", json={"fault": "explode"})
        failed = httpx.post(sim.url + "/v1/chat/completions", json={"model": CHAT, "messages": MESSAGES})
        assert httpx.get(sim.url + "/_sim/stats").json()["faults"][0]["count"] == 2
        httpx.delete(sim.url + "/_sim/faults")
        fine = httpx.post(sim.url + "/v1/chat/completions", json={"model": CHAT, "messages": MESSAGES})
        reset = httpx.post(sim.url + "/_sim/reset").json()
    assert added["added"] == {"fault": "error:500", "model": CHAT, "count": 3, "path": None}
    assert listed["faults"] == [added["added"]]
    assert bad.status_code == 400 and "unknown fault" in bad.json()["error"]
    assert failed.status_code == 500 and failed.json()["error"]["message"] == "simulated fault: HTTP 500 Internal Server Error"
    assert fine.status_code == 200
    assert reset["requests"] == 0 and reset["faults_served"] == 0 and reset["faults"] == []


def test_fault_spec_grammar():
    assert parse_fault("drop") == Fault("drop")
    assert parse_fault("drop@:2") == Fault("drop", count=2)
    assert parse_fault("verdict:no-user-query@qwen3:8b:1") == Fault("verdict:no-user-query", model="qwen3:8b", count=1)
    assert parse_fault("error:503@qwen3:8b") == Fault("error:503", model="qwen3:8b")
    assert str(parse_fault("cut@gemma4:e4b:3")) == "cut@gemma4:e4b:3"
    for bad in ("explode", "verdict:nope", "error:200", "error:x", "drop@:0"):
        with pytest.raises(ValueError):
            parse_fault(bad)
