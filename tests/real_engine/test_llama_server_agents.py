"""Agent clients against a real llama-server: the official anthropic SDK on /v1/messages and
/v1/messages/count_tokens, and the openai SDK on /v1/responses, through one node and across a
hop, sent byte for byte because this llama-server serves them natively (found by probing).

The model is the generated tiny one, whose output is random bytes: it never chooses to call a
tool, so here a tool definition and a tool_result turn are shown to be carried and answered,
while a streamed tool_use's arguments are shown whole against the simulator
(tests/test_clients_agents.py), where a call is certain.
"""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest
from harness import fqdn, make_pool, pair, poll_until_offered
from real_engine.support import MODEL_ID

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(60)]

WEATHER = {"name": "get_weather", "description": "The weather in a place",
           "input_schema": {"type": "object", "properties": {"location": {"type": "string"}},
                            "required": ["location"]}}


@pytest.fixture
def pool(tmp_path, start_llama):
    """hub-b serves the real llama-server (--jinja, as tool use needs); hub-a has no engine."""
    server = start_llama(ctx=2048, extra=("--jinja",))
    nodes = make_pool(tmp_path, ["hub-a", "hub-b"], per_node={"hub-b": {"LLAMACPP_URL": server.url}})
    for n in nodes.values():
        n.start()
    try:
        pair(nodes["hub-a"], nodes["hub-b"])
        poll_until_offered(nodes["hub-a"], [nodes["hub-b"]], MODEL_ID)
        yield nodes, server
    finally:
        for n in nodes.values():
            n.stop()


def test_anthropic_sdk_against_a_real_llama_server_locally_and_across_a_hop(pool):
    nodes, server = pool
    # this build's first streamed /v1/messages answer after start lacks its message_start event
    # (seen without hubpool too, and the SDK then cannot assemble the message): one first
    first = httpx.post(server.url + "/v1/messages", json={"model": MODEL_ID, "max_tokens": 1, "stream": True,
                                                           "messages": [{"role": "user", "content": "x"}]})
    assert first.status_code == 200
    with nodes["hub-a"].client(headers=nodes["hub-a"].headers()) as c:
        caps = next(iter(c.get("/api/inference/pool/status").json()["peers"]))["lastCapabilities"]
    # found by probing the real server: Messages, count_tokens and Responses; no rerank without --reranking
    assert caps["backends"][0]["dialects"] == ["count-tokens", "messages", "openai", "responses"]
    turn = [{"role": "user", "content": "weather in Oslo?"}]
    for entry, served_by in ((nodes["hub-b"], "local"), (nodes["hub-a"], fqdn("hub-b"))):
        claude = anthropic.Anthropic(base_url=entry.url, api_key="unused-inside", max_retries=0)
        raw = claude.messages.with_raw_response.create(model=MODEL_ID, max_tokens=8, messages=turn)
        assert raw.headers["x-hub-pool-served-by"] == served_by and raw.headers["x-hub-pool-backend"] == "llamacpp"
        message = raw.parse()
        assert message.type == "message" and message.content[0].type == "text"
        assert message.stop_reason in ("max_tokens", "end_turn") and message.usage.output_tokens >= 1
        # greedy: the random model's bytes are the same on every run (a sampled run can emit bytes
        # that this build streams badly, which would make the test flaky, not the relay)
        with claude.messages.stream(model=MODEL_ID, max_tokens=8, messages=turn, tools=[WEATHER],
                                    extra_body={"temperature": 0, "top_k": 1}) as stream:
            assert stream.response.headers["x-hub-pool-served-by"] == served_by
            kinds = [event.type for event in stream]
            streamed = stream.get_final_message()
        # (the SDK reads message_start itself before it yields events)
        assert "content_block_delta" in kinds and kinds[-1] == "message_stop" and streamed.stop_reason
        # the tool_result turn, with the call's id, goes to the engine as sent and is answered
        history = [*turn, {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"location": "Oslo"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "sunny"}]}]
        answer = claude.messages.create(model=MODEL_ID, max_tokens=4, tools=[WEATHER], messages=history)
        assert answer.type == "message" and answer.stop_reason is not None
        counted = claude.messages.count_tokens(model=MODEL_ID, messages=turn)
        direct = httpx.post(server.url + "/v1/messages/count_tokens", json={"model": MODEL_ID, "messages": turn})
        assert counted.input_tokens == direct.json()["input_tokens"] > 0  # the engine's own count, untranslated
        codex = openai.OpenAI(base_url=entry.url + "/v1", api_key="unused-inside", max_retries=0)
        response = codex.responses.create(model=MODEL_ID, input="hello", max_output_tokens=4)
        assert response.object == "response" and response.status in ("completed", "incomplete")
        # greedy here too: sampled, this build's stream is now and then one response.completed
        # event with no response.created (3 of 300 streams straight to the engine, no hubpool)
        events = [e.type for e in codex.responses.create(model=MODEL_ID, input="hello", max_output_tokens=4,
                                                          stream=True, temperature=0, extra_body={"top_k": 1})]
        assert events[0] == "response.created" and events[-1] in ("response.completed", "response.incomplete"), events
    with nodes["hub-a"].client(headers=nodes["hub-a"].headers()) as c:
        rows = c.get("/api/inference/pool/routing-log?limit=50").json()["entries"]
    agent_rows = [r for r in rows if r["path"] in ("/v1/messages", "/v1/responses")]
    assert agent_rows and all(r["outcome"] == "served" and r["node"] == fqdn("hub-b") for r in agent_rows), agent_rows
