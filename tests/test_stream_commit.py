"""The commit point moves to the first real token (issue 28 item 1) and a waiting agent stream
is kept alive (issue 25 item 4), through two running nodes beside simulated engines.

hub-a's engines come first for hub-a's requests (its local head start); a test arms one of
them with ``mute`` — headers and the stream's opening (a role-only chunk, message_start,
response.created), then silence: an engine wedged in prefill — and hub-b's answer must reach
the app whole, with nothing of hub-a's attempt before it.
"""

from __future__ import annotations

import time
from contextlib import ExitStack

import anthropic
import httpx
import openai
import pytest
from streams import (
    BUDGET_MS,
    CASE_IDS,
    CASES,
    NATIVE_MODEL,
    OLLAMA_MODEL,
    error_of,
    events,
    request,
    row,
    served_by,
    settings,
    sim_for,
    start_pool,
    stream,
    text_of,
)

WHOLE = " ".join(f"tok{i}" for i in range(12))


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    with ExitStack() as stack:
        yield start_pool(stack, tmp_path_factory.mktemp("commit"))


@pytest.fixture(autouse=True)
def clean(pool):
    nodes, sims = pool
    for sim in sims.values():
        sim.reset()
        sim.configure(prefill_tps=0)
    settings(nodes["hub-a"], poolStreamKeepAliveMs=15000, poolStreamFirstToken=1)
    yield


@pytest.mark.parametrize("dialect,model", CASES, ids=CASE_IDS)
def test_headers_then_silence_fails_over_before_any_byte_reaches_the_app(pool, dialect, model):
    nodes, sims = pool
    sim_for(sims, "a", model).add_fault("mute", count=1)
    started = time.monotonic()
    response = stream(nodes["hub-a"], dialect, model)
    waited = time.monotonic() - started
    assert response.status_code == 200, response.text
    # the headers are hub-b's answer's: hub-a's engine's never reached the app
    assert response.headers["x-hub-pool-served-by"] == served_by("hub-b")
    assert text_of(dialect, response.content) == WHOLE
    names = [name or (data.get("type") if isinstance(data, dict) else data) for name, data in events(response.content)]
    if dialect == "messages":
        assert names.count("message_start") == 1 and names[0] == "message_start"
    elif dialect == "responses":
        assert names.count("response.created") == 1 and names[0] == "response.created"
    elif dialect == "openai":
        roles = [c["delta"].get("role") for _n, d in events(response.content) if isinstance(d, dict)
                 for c in d.get("choices") or [] if "role" in c.get("delta", {})]
        assert len(roles) == 1  # hub-a's role-only chunk was held, never sent
    assert waited >= BUDGET_MS / 1000 * 0.9
    logged = row(nodes["hub-a"], response.headers["x-hub-pool-request-id"])
    assert logged["outcome"] == "served" and logged["failedOverFrom"] == ["local"]
    assert logged["attempts"][0]["reason"] == f"no first token within {BUDGET_MS}ms"
    assert sim_for(sims, "a", model).stats()["aborted"] == 1  # the wedged engine was let go


def test_first_token_off_commits_at_the_headers(pool):
    """poolStreamFirstToken 0 is the spec's commit point: the wedged engine's headers reach
    the app, and the stream is left to the app's own read timeout."""
    nodes, sims = pool
    settings(nodes["hub-a"], poolStreamFirstToken=0)
    sim_for(sims, "a", NATIVE_MODEL).add_fault("mute", count=1)
    route, body = request("openai", NATIVE_MODEL)
    with httpx.stream("POST", nodes["hub-a"].url + route, json=body, timeout=httpx.Timeout(10, read=2.5)) as response:
        assert response.headers["x-hub-pool-served-by"] == "local"
        with pytest.raises(httpx.ReadTimeout):
            response.read()


@pytest.mark.parametrize("dialect,model", [c for c in CASES if c[0] != "native"],
                         ids=[i for c, i in zip(CASES, CASE_IDS, strict=True) if c[0] != "native"])
def test_keepalives_while_failing_over_then_the_whole_answer(pool, dialect, model):
    """Keep-alives from 300 ms: the app has its 200 and the stream's type early, pings (or
    comments) while hub-a's engine stays silent, then hub-b's whole answer in one stream."""
    nodes, sims = pool
    settings(nodes["hub-a"], poolStreamKeepAliveMs=300)
    sim_for(sims, "a", model).add_fault("mute", count=1)
    response = stream(nodes["hub-a"], dialect, model)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    rid = response.headers["x-hub-pool-request-id"]
    assert response.headers["x-hub-pool-model"] == model
    assert "x-hub-pool-served-by" not in response.headers  # committed before any node answered
    raw = response.content
    if dialect == "messages":
        assert raw.startswith(b'event: ping\ndata: {"type": "ping"}\n\n')
    else:
        assert raw.startswith(b": keep-alive\n\n")
    assert text_of(dialect, raw) == WHOLE
    logged = row(nodes["hub-a"], rid)
    assert logged["outcome"] == "served" and logged["node"] == served_by("hub-b") and logged["keepAlive"] is True


def _claude(node) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=node.url, api_key="unused-inside", max_retries=0)


def _codex(node) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="unused-inside", max_retries=0)


@pytest.mark.parametrize("model", [NATIVE_MODEL, OLLAMA_MODEL], ids=["native", "translated"])
def test_sdks_read_a_slow_prefill_kept_alive_whole(pool, model):
    """The engine takes ~1.2 s to its first token (a slow prefill), keep-alives every 300 ms:
    each official SDK gets the whole answer from the one engine."""
    nodes, sims = pool
    settings(nodes["hub-a"], poolStreamKeepAliveMs=300)
    sim_for(sims, "a", model).configure(prefill_tps=8)  # the question is ~10 tokens
    node = nodes["hub-a"]
    with _claude(node).messages.stream(model=model, max_tokens=12,
                                       messages=[{"role": "user", "content": "Why is the sky blue?"}]) as s:
        message = s.get_final_message()
    assert message.content[0].text == WHOLE and message.stop_reason == "max_tokens"
    final = None
    with _codex(node).responses.stream(model=model, input="Why is the sky blue?") as s:
        final = s.get_final_response()
    assert final.output_text == WHOLE and final.status == "completed"
    chunks = list(_codex(node).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Why is the sky blue?"}], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == WHOLE
    generation = ("/v1/messages", "/v1/responses", "/v1/chat/completions")
    assert not set(generation) & set(sim_for(sims, "b", model).stats()["by_path"])  # never failed over
    assert sim_for(sims, "a", model).stats()["aborted"] == 0


@pytest.mark.parametrize("model", [NATIVE_MODEL, OLLAMA_MODEL], ids=["native", "translated"])
def test_sdks_raise_the_dialects_error_when_every_candidate_fails_after_keepalives(pool, model):
    nodes, sims = pool
    settings(nodes["hub-a"], poolStreamKeepAliveMs=300)
    node = nodes["hub-a"]
    for hub in ("a", "b"):
        sim_for(sims, hub, model).add_fault("mute", count=4)
    with pytest.raises(anthropic.APIStatusError) as raised:
        with _claude(node).messages.stream(model=model, max_tokens=12,
                                           messages=[{"role": "user", "content": "Why is the sky blue?"}]) as s:
            s.get_final_message()
    assert raised.value.body["error"]["type"] == "api_error"
    assert "No pool candidate answered" in raised.value.body["error"]["message"]
    with pytest.raises(openai.APIError) as chat_error:
        list(_codex(node).chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Why is the sky blue?"}], stream=True))
    assert "No pool candidate answered" in chat_error.value.message
    seen = [e.type for e in _codex(node).responses.create(model=model, input="Why is the sky blue?", stream=True)]
    assert seen == ["response.created", "response.failed"]
    with pytest.raises(RuntimeError, match="response.completed"):
        with _codex(node).responses.stream(model=model, input="Why is the sky blue?") as s:
            s.get_final_response()


def test_the_error_event_names_the_failure_for_raw_clients(pool):
    nodes, sims = pool
    settings(nodes["hub-a"], poolStreamKeepAliveMs=300)
    for hub in ("a", "b"):
        sim_for(sims, hub, NATIVE_MODEL).add_fault("mute", count=1)
    response = stream(nodes["hub-a"], "messages", NATIVE_MODEL)
    assert response.status_code == 200
    assert error_of("messages", response.content).startswith('No pool candidate answered for model "m:8b"')
    assert response.content.rstrip().endswith(b"}")  # the error event is the stream's last
    logged = row(nodes["hub-a"], response.headers["x-hub-pool-request-id"])
    assert logged["outcome"] == "failed" and logged["status"] == 502
    # the passed-over candidate is in attempts; the last one's failure is the row's reason (issue 26)
    assert [a["reason"] for a in logged["attempts"]] == [f"no first token within {BUDGET_MS}ms"]
    assert logged["reason"] == f"no first token within {BUDGET_MS}ms"
