"""The captured request of each real client (tests/real_clients/data/), replayed through a
node as the client sent it, natively and translated: 200 and a stream in its dialect's exact
event order. Then bad input built from the same requests: the dialect's error shape and a
4xx for what the node judges, never a 500 whatever the client sends, and a stranger's body
refused as before. No client binary is needed: these run wherever the suite runs."""

from __future__ import annotations

import json

import httpx
import pytest
from harness import RunningNode
from real_clients.agents import AGENTS
from real_clients.fixtures import check_chat_stream, check_messages_stream, check_responses_stream, load, request
from real_clients.support import MODEL, sim_config

from hubpool_sim import run_in_thread

pytestmark = [pytest.mark.real_clients, pytest.mark.timeout(300)]

CHECK = {"claude-code": check_messages_stream, "codex": check_responses_stream, "opencode": check_chat_stream}


def post(node, agent: str, body: bytes | None = None, headers: dict[str, str] | None = None,
         **changes) -> httpx.Response:
    path, sent_headers, sent = request(agent, MODEL, **changes)
    with httpx.Client(base_url=node.url, timeout=60, trust_env=False) as c:
        return c.post(path, content=sent if body is None else body, headers={**sent_headers, **(headers or {})})


def test_the_fixtures_are_the_clients_requests_with_their_prose_and_keys_gone():
    for agent in AGENTS:
        fixture = load(agent)
        text = json.dumps(fixture)
        assert not {"authorization", "x-api-key"} & {k.lower() for k in fixture["headers"]}, agent
        assert "sk-" not in text and "Bearer" not in text, agent
        assert fixture["capturedBytes"] > 25_000 and fixture["body"]["tools"], agent  # a real turn, tools and all
    claude = load("claude-code")
    assert claude["path"] == "/v1/messages?beta=true" and len(claude["headers"]["anthropic-beta"].split(",")) >= 7
    assert any(m["role"] == "system" for m in claude["body"]["messages"]), "Claude Code's system message in messages"
    assert claude["body"]["max_tokens"] >= 32000 and claude["body"]["thinking"]["type"] == "adaptive"
    codex = load("codex")
    assert codex["body"]["store"] is False and codex["headers"]["session-id"] == codex["body"]["prompt_cache_key"]
    assert {t["type"] for t in codex["body"]["tools"]} >= {"function", "namespace", "web_search"}
    assert load("opencode")["headers"]["x-session-id"]


@pytest.mark.parametrize("mode", ["native", "translated"])
@pytest.mark.parametrize("agent", AGENTS)
def test_a_captured_request_replayed_through_a_node_streams_in_the_dialects_order(agent, mode, engines):
    node, sim = engines[mode]
    path, headers, sent = request(agent, MODEL)
    r = post(node, agent)
    assert r.status_code == 200, r.text[:2000]
    assert r.headers["x-hub-pool-served-by"] == "local" and r.headers["content-type"].startswith("text/event-stream")
    CHECK[agent](r.text)
    last = sim.stats()["last_request"]
    if mode == "native" and agent != "opencode":
        # untranslated: the engine got the body byte for byte and the betas verbatim
        assert last["path"] == path.split("?")[0] and last["body_bytes"] == len(sent), last
        if agent == "claude-code":
            assert last["headers"]["anthropic-beta"] == headers["anthropic-beta"], last
    else:
        assert last["path"] == "/v1/chat/completions", last


def _error_shape(agent: str, body) -> bool:
    """Anthropic's ``{"type": "error", "error": {"type", "message"}}`` for Messages, an OpenAI
    error object for Responses, and for chat completions hubpool's ``{"error": message}``
    (README, Routes) or an engine's error object."""
    error = body.get("error") if isinstance(body, dict) else None
    if agent == "opencode" and isinstance(error, str):
        return bool(error)
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return False
    return body.get("type") == "error" if agent == "claude-code" else True


@pytest.mark.parametrize("agent", AGENTS)
def test_what_no_engine_could_serve_is_refused_in_the_dialects_shape(agent, engines):
    node, _sim = engines["native"]
    path, _headers, sent = request(agent, MODEL)
    whole = json.loads(sent)
    cases = {"not JSON": sent[: len(sent) // 2], "an array": b"[1, 2]", "a string": b'"hello"', "empty": b"",
             "no model": json.dumps({k: v for k, v in whole.items() if k != "model"}).encode(),
             "model not a string": json.dumps({**whole, "model": 7}).encode()}
    for case, body in cases.items():
        r = post(node, agent, body=body)
        assert 400 <= r.status_code < 500, (case, r.status_code, r.text[:500])
        assert _error_shape(agent, r.json()), (case, r.text[:500])


MUTATIONS = {"deleted": ..., "null": None, "a number": 12345, "a string": "x", "a list": [], "an object": {}}


@pytest.mark.parametrize("native", [True, False], ids=["native", "translated"])
@pytest.mark.parametrize("agent", AGENTS)
def test_nothing_a_client_sends_makes_the_node_answer_500(agent, native, tmp_path):
    """Every top-level field of the real request deleted or replaced by each JSON type, and the
    first message or item of each list garbled: the answer is a 2xx, a 4xx with an error body
    (the node's, or natively the engine's own), or the node's 502 when the engine itself broke
    on the body (the simulated llama-server answers 500 to a stream_options that is no object,
    and the node, reading a sick engine, withholds the model: this test has its own node) —
    never a 500 from the node."""
    with run_in_thread(sim_config(agent_routes=native)) as sim, \
            RunningNode(tmp_path / "node", {"LLAMACPP_URL": sim.url}) as node:
        failures = _garble_every_field(agent, node)
    assert not failures, failures


def _garble_every_field(agent, node) -> list:
    whole = json.loads(request(agent, MODEL)[2])
    bodies = []
    for key in whole:
        if key == "model":
            continue
        for name, value in MUTATIONS.items():
            changed = {k: v for k, v in whole.items() if k != key} if value is ... else {**whole, key: value}
            bodies.append((f"{key} {name}", changed))
        if isinstance(whole[key], list) and whole[key]:
            for junk in (None, 3, "x", [], {"type": "nonsense"}):
                bodies.append((f"{key}[0] = {junk!r}", {**whole, key: [junk, *whole[key][1:]]}))
    bodies.append(("an unknown model", {**whole, "model": "no-such-model:1b"}))
    failures = []
    for case, body in bodies:
        r = post(node, agent, body=json.dumps(body).encode())
        error = r.json().get("error") if r.headers.get("content-type", "").startswith("application/json") else None
        ok = r.status_code < 300 or (r.status_code in range(400, 500) or r.status_code == 502) and bool(error)
        if not ok:
            failures.append((case, r.status_code, r.text[:300]))
    return failures


@pytest.mark.parametrize("agent", AGENTS)
def test_a_strangers_captured_request_is_still_refused(agent, engines):
    """The same real body from outside (behind a reverse proxy that adds cf-ray) without an
    inference key: 401, in the dialect's shape, and nothing reaches the engine."""
    node, sim = engines["native"]
    before = sim.stats()["by_model"].get(MODEL, 0)
    r = post(node, agent, headers={"cf-ray": "8a1b2c3d4e5f6789-AMS"})
    assert r.status_code == 401, r.text[:500]
    assert _error_shape(agent, r.json()), r.text[:500]
    assert sim.stats()["by_model"].get(MODEL, 0) == before


def test_the_scrubber_drops_keys_and_replaces_ids_and_prose_keeping_the_shape():
    from real_clients.scrub_capture import scrub

    session = "1f6883f5-89ad-4af4-9b80-ac6a0cd396bc"
    prose = "You are an interactive CLI tool that helps users with software engineering tasks.\n  Be brief."
    raw = {"method": "POST", "path": "/v1/messages?beta=true",
           "headers": {"x-api-key": "sk-ant-secret", "Authorization": "Bearer sk-x", "Host": "127.0.0.1:9",
                       "X-Claude-Code-Session-Id": session, "anthropic-beta": "a-2025,b-2026"},
           "body": json.dumps({"model": "m", "system": [{"type": "text", "text": prose}],
                               "metadata": {"user_id": json.dumps({"device_id": "ab" * 32, "session_id": session})},
                               "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hi."}]}],
                               "tools": [{"name": "Read", "description": "Reads a file from the local filesystem.",
                                          "input_schema": {"type": "object", "properties": {
                                              "file_path": {"type": "string", "description": "The absolute path"}}}}],
                               "max_tokens": 32000})}
    fixture = scrub(raw, agent="claude-code", version="2.1.328", keep=("Say hi.",))
    assert set(fixture["headers"]) == {"X-Claude-Code-Session-Id", "anthropic-beta"}
    assert fixture["headers"]["anthropic-beta"] == "a-2025,b-2026"
    stand_in = fixture["headers"]["X-Claude-Code-Session-Id"]
    assert stand_in != session and len(stand_in) == len(session) and stand_in.count("-") == 4
    user_id = json.loads(fixture["body"]["metadata"]["user_id"])
    assert user_id["session_id"] == stand_in and user_id["device_id"] != "ab" * 32  # the same id, the same stand-in
    filler = fixture["body"]["system"][0]["text"]
    assert len(filler) == len(prose) and filler.count("\n") == 1 and filler.count(" ") == prose.count(" ")
    assert "interactive" not in filler and "Reads" not in json.dumps(fixture["body"]["tools"])
    assert fixture["body"]["tools"][0]["name"] == "Read" and fixture["body"]["max_tokens"] == 32000
    assert fixture["body"]["messages"][0]["content"][0]["text"] == "Say hi."  # the test's own prompt stays
    assert scrub(raw, agent="claude-code", version="2.1.328", keep=("Say hi.",)) == fixture  # deterministic
