"""The Messages and Responses translators on their own: what survives each direction (the
rows of docs/translation.md), and that a stream split anywhere translates the same."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from hubpool_core.proxy.translate import translator_for
from hubpool_core.proxy.translate_messages import MessagesToChat
from hubpool_core.proxy.translate_responses import ResponsesToChat

IMAGE = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}


def _chunk(delta=None, finish=None, usage=None):
    obj = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": []}
    if delta is not None or finish is not None:
        obj["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish}]
    if usage is not None:
        obj["usage"] = usage
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


#: an engine's streamed answer: text, then two parallel calls with arguments in pieces
STREAM = b"".join([
    _chunk({"role": "assistant", "content": "Let me "}), _chunk({"content": "check."}),
    _chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                            "function": {"name": "get_weather", "arguments": ""}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"loca'}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'tion":"Oslo"}'}}]}),
    _chunk({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                            "function": {"name": "get_time", "arguments": '{"zone":"CET"}'}}]}),
    _chunk(finish="tool_calls"), _chunk(usage={"prompt_tokens": 40, "completion_tokens": 12}), b"data: [DONE]\n\n",
])


def _events(raw: bytes):
    out = []
    for block in raw.decode().split("\n\n"):
        data = [ln[5:].strip() for ln in block.splitlines() if ln.startswith("data:")]
        if data:
            out.append(json.loads(data[0]))
    return out


def _feed_all(translator, raw: bytes, cuts: list[int]) -> bytes:
    out, last = b"", 0
    for cut in [*sorted(cuts), len(raw)]:
        out += b"".join(translator.feed(raw[last:cut]))
        last = cut
    return out + b"".join(translator.end())


def test_messages_request_system_blocks_images_tools_ids_and_results():
    body = {
        "model": "m", "max_tokens": 100, "temperature": 0.2, "top_k": 5, "stop_sequences": ["END"],
        "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}},
                   {"type": "text", "text": " Always."}],
        "metadata": {"user_id": "u"}, "thinking": {"type": "enabled", "budget_tokens": 1000},
        "tools": [{"name": "get_weather", "description": "w", "input_schema": {"type": "object"}},
                  {"type": "web_search_20250305", "name": "web_search"}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                         {"type": "image", "source": IMAGE}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                                              {"type": "text", "text": "Checking."},
                                              {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                               "input": {"location": "Oslo"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                          "content": [{"type": "text", "text": "sunny"}]},
                                         {"type": "text", "text": "and tomorrow?"}]},
        ]}
    up = MessagesToChat("/v1/messages", body, stream=True).upstream_body
    assert up["messages"][0] == {"role": "system", "content": "You are terse. Always."}  # blocks joined, no marks
    assert up["messages"][1] == {"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}
    assert up["messages"][2] == {"role": "assistant", "content": "Checking.", "tool_calls": [
        {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"location": "Oslo"}'}}]}
    assert up["messages"][3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}  # result first
    assert up["messages"][4] == {"role": "user", "content": "and tomorrow?"}
    assert up["tools"] == [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"},
                                                             "description": "w"}}]  # the server tool is dropped
    assert up["tool_choice"] == "required" and up["parallel_tool_calls"] is False
    assert (up["max_tokens"], up["temperature"], up["top_k"], up["stop"]) == (100, 0.2, 5, ["END"])
    assert up["stream_options"] == {"include_usage": True}
    assert "thinking" not in json.dumps(up) and "cache_control" not in json.dumps(up) and "metadata" not in up


def test_messages_answer_whole_tool_use_ids_stop_reasons_usage_and_errors():
    t = MessagesToChat("/v1/messages", {"model": "m", "messages": []}, stream=False)
    answer = {"id": "x", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "ok", "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}},
            {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": "not json"}}]}}],
              "usage": {"prompt_tokens": 9, "completion_tokens": 3}}
    out = json.loads(t.whole(200, json.dumps(answer).encode()))
    assert out["type"] == "message" and out["stop_reason"] == "tool_use"
    assert out["content"] == [{"type": "text", "text": "ok"},
                              {"type": "tool_use", "id": "call_a", "name": "f", "input": {"a": 1}},
                              {"type": "tool_use", "id": "call_b", "name": "g", "input": {"arguments": "not json"}}]
    assert out["usage"] == {"input_tokens": 9, "output_tokens": 3}
    for finish, stop in (("stop", "end_turn"), ("length", "max_tokens"), (None, None)):
        answer = {"choices": [{"finish_reason": finish, "message": {"content": "x"}}]}
        assert json.loads(t.whole(200, json.dumps(answer).encode()))["stop_reason"] == stop
    err = json.loads(t.whole(400, b'{"error": {"message": "bad things", "type": "x"}}'))
    assert err == {"type": "error", "error": {"type": "invalid_request_error", "message": "bad things"}}
    assert json.loads(t.whole(503, b"upstream gone"))["error"]["type"] == "api_error"


def test_messages_stream_blocks_pieces_and_the_closing_events():
    out = _events(_feed_all(MessagesToChat("/v1/messages", {"model": "m", "messages": []}, True), STREAM, []))
    kinds = [e["type"] for e in out]
    assert kinds == ["message_start", "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_stop", "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_stop", "content_block_start", "content_block_delta", "content_block_stop",
                     "message_delta", "message_stop"]
    assert out[5]["content_block"] == {"type": "tool_use", "id": "call_a", "name": "get_weather", "input": {}}
    assert out[6]["delta"] == {"type": "input_json_delta", "partial_json": '{"loca'} and out[6]["index"] == 1
    assert out[9]["content_block"]["id"] == "call_b" and out[10]["index"] == 2
    assert out[12]["delta"]["stop_reason"] == "tool_use"
    assert out[12]["usage"] == {"output_tokens": 12, "input_tokens": 40}


def test_a_cut_stream_stays_cut_and_an_error_frame_becomes_an_error_event():
    head = _chunk({"content": "partial"})
    for t in (MessagesToChat("/v1/messages", {"model": "m", "messages": []}, True),
              ResponsesToChat("/v1/responses", {"model": "m", "input": "x"}, True)):
        kinds = [e["type"] for e in _events(_feed_all(t, head, []))]
        assert "message_stop" not in kinds and "response.completed" not in kinds and kinds  # visibly cut
    errored = _events(b"".join(MessagesToChat("/v1/messages", {"model": "m", "messages": []}, True).feed(
        b'data: {"error": {"message": "engine died"}}\n\n')))
    assert errored[-1] == {"type": "error", "error": {"type": "api_error", "message": "engine died"}}


def test_count_tokens_is_a_one_token_completion_never_below_the_estimate():
    body = {"model": "m", "system": "s" * 400, "messages": [{"role": "user", "content": "hello"}]}
    t = translator_for("/v1/messages/count_tokens", "count-tokens", body, False, {"openai"})
    assert t.upstream_body["max_tokens"] == 1 and t.upstream_body["stream"] is False
    raw = json.dumps({"choices": [{"finish_reason": "length", "message": {"content": "x"}}],
                      "usage": {"prompt_tokens": 130, "completion_tokens": 1}}).encode()
    assert json.loads(t.whole(200, raw)) == {"input_tokens": 130}
    cached = json.dumps({"choices": [{"finish_reason": "length", "message": {"content": "x"}}],
                         "usage": {"prompt_tokens": 2, "completion_tokens": 1}}).encode()
    assert json.loads(t.whole(200, cached))["input_tokens"] >= 100  # an engine that counted only the uncached


def test_responses_request_items_calls_outputs_tools_and_format():
    body = {"model": "m", "instructions": "be brief", "max_output_tokens": 50, "parallel_tool_calls": True,
            "store": True, "reasoning": {"effort": "high"},
            "text": {"format": {"type": "json_schema", "name": "r", "schema": {"type": "object"}, "strict": True}},
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}},
                      {"type": "web_search_preview"}],
            "tool_choice": {"type": "function", "name": "f"},
            "input": [{"role": "developer", "content": "rules"},
                      {"type": "message", "role": "user", "content": [
                          {"type": "input_text", "text": "look"},
                          {"type": "input_image", "image_url": "data:image/png;base64,AA"}]},
                      {"type": "reasoning", "id": "rs_1", "summary": []},
                      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a":1}'},
                      {"type": "function_call", "call_id": "c2", "name": "f", "arguments": '{"a":2}'},
                      {"type": "function_call_output", "call_id": "c1", "output": "one"},
                      {"type": "function_call_output", "call_id": "c2", "output": "two"}]}
    up = ResponsesToChat("/v1/responses", body, True).upstream_body
    assert up["messages"][:2] == [{"role": "system", "content": "be brief"}, {"role": "system", "content": "rules"}]
    assert up["messages"][2]["content"][1] == {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}
    assert up["messages"][3] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}},
        {"id": "c2", "type": "function", "function": {"name": "f", "arguments": '{"a":2}'}}]}  # parallel: one turn
    assert up["messages"][4:] == [{"role": "tool", "tool_call_id": "c1", "content": "one"},
                                  {"role": "tool", "tool_call_id": "c2", "content": "two"}]
    assert up["tools"] == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert up["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert up["response_format"] == {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"},
                                                                            "strict": True}}
    assert up["max_tokens"] == 50 and "reasoning" not in up and "store" not in up


def test_responses_answer_and_stream_say_store_false_and_carry_calls():
    t = ResponsesToChat("/v1/responses", {"model": "m", "input": "x"}, False)
    answer = {"choices": [{"finish_reason": "length", "message": {"content": "partial answer"}}],
              "usage": {"prompt_tokens": 5, "completion_tokens": 7}}
    out = json.loads(t.whole(200, json.dumps(answer).encode()))
    assert out["object"] == "response" and out["status"] == "incomplete" and out["store"] is False
    assert out["output"][0]["content"][0]["text"] == "partial answer" and out["usage"]["total_tokens"] == 12
    assert json.loads(t.whole(404, b'{"error": "model x not found"}')) == {"error": {
        "message": "model x not found", "type": "not_found_error", "param": None, "code": None}}
    events = _events(_feed_all(ResponsesToChat("/v1/responses", {"model": "m", "input": "x"}, True), STREAM, []))
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["message", "function_call", "function_call"]
    assert final["output"][1]["call_id"] == "call_a" and json.loads(final["output"][1]["arguments"]) == {
        "location": "Oslo"}
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"
                     and e["item_id"] == final["output"][1]["id"])
    assert json.loads(deltas) == {"location": "Oslo"}


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_a_stream_split_anywhere_translates_the_same(cuts):
    """The engine's bytes arrive in chunks cut anywhere (mid-line, mid-UTF-8 never matters: it
    is ASCII here): both translators write the same events as when fed whole."""
    for make in (lambda: MessagesToChat("/v1/messages", {"model": "m", "messages": []}, True),
                 lambda: ResponsesToChat("/v1/responses", {"model": "m", "input": "x"}, True)):
        random_ids = ("response", "item", "message", "item_id")  # minted per exchange
        whole = [{k: v for k, v in e.items() if k not in random_ids} for e in _events(_feed_all(make(), STREAM, []))]
        split = [{k: v for k, v in e.items() if k not in random_ids}
                 for e in _events(_feed_all(make(), STREAM, cuts))]
        assert split == whole
