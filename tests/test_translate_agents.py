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


# -- issue 25: what the real agents send beyond the SDKs' clean requests ------------------

def test_claude_codes_system_message_inside_messages_stays_a_system_message_in_place():
    body = {"model": "m", "max_tokens": 32000, "thinking": {"type": "adaptive"}, "output_config": {"effort": "high"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.328;"},
                       {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "<reminder>"},
                                                      {"type": "text", "text": "Say hello"}]},
                         {"role": "system", "content": [{"type": "text", "text": "# Environment",
                                                         "cache_control": {"type": "ephemeral"}}]},
                         {"role": "developer", "content": "be brief"}],
            "tools": [{"name": "Read", "description": "d", "input_schema": {"type": "object"},
                       "defer_loading": True, "strict": True, "eager_input_streaming": True},
                      {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}]}
    out = MessagesToChat("/v1/messages", body, True).upstream_body
    assert [m["role"] for m in out["messages"]] == ["system", "user", "system", "system"]
    assert out["messages"][2] == {"role": "system", "content": "# Environment"}
    assert out["messages"][3] == {"role": "system", "content": "be brief"}
    assert out["tools"] == [{"type": "function", "function": {"name": "Read", "description": "d",
                                                              "parameters": {"type": "object"}}}]
    assert not {"thinking", "output_config", "context_management", "metadata"} & set(out)
    assert out["max_tokens"] == 32000


CODEX_TOOLS = [
    {"type": "function", "name": "exec_command", "description": "run", "strict": False,
     "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
    {"type": "namespace", "name": "multi_agent_v1", "description": "agents", "tools": [
        {"type": "function", "name": "spawn", "parameters": {"type": "object"}}]},
    {"type": "web_search", "external_web_access": False},
    {"type": "custom", "name": "apply_patch", "description": "Apply a patch",
     "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
]


def test_codex_request_developer_items_hosted_tools_custom_tools_and_reasoning():
    body = {"model": "m", "store": False, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k",
            "reasoning": {"summary": "auto"}, "tools": CODEX_TOOLS, "tool_choice": "auto",
            "input": [
                {"type": "message", "id": "msg_1", "role": "developer", "content": [{"type": "input_text",
                                                                                      "text": "rules"}]},
                {"type": "message", "id": "msg_2", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA"},
                {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "exec_command",
                 "arguments": '{"cmd":"ls"}'},
                {"type": "function_call_output", "call_id": "c1",
                 "output": [{"type": "input_text", "text": "a.txt\n"}, {"type": "input_text", "text": "b.txt"}]},
                {"type": "custom_tool_call", "id": "ctc_2", "call_id": "c2", "name": "apply_patch",
                 "input": "*** Begin Patch"},
                {"type": "custom_tool_call_output", "call_id": "c2", "output": "Done"},
                {"type": "item_reference", "id": "msg_never_looked_up"},
            ]}
    out = ResponsesToChat("/v1/responses", body, False).upstream_body
    assert [m["role"] for m in out["messages"]] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert out["messages"][3] == {"role": "tool", "tool_call_id": "c1", "content": "a.txt\nb.txt"}
    assert json.loads(out["messages"][4]["tool_calls"][0]["function"]["arguments"]) == {"input": "*** Begin Patch"}
    assert out["messages"][5] == {"role": "tool", "tool_call_id": "c2", "content": "Done"}
    names = [t["function"]["name"] for t in out["tools"]]
    assert names == ["exec_command", "apply_patch"]  # namespace and web_search dropped
    patch = out["tools"][1]["function"]
    assert patch["parameters"]["required"] == ["input"] and patch["parameters"]["properties"]["input"]["type"] == \
        "string"
    assert not {"store", "include", "prompt_cache_key", "reasoning"} & set(out)


def _custom_call_stream(arguments: list[str]) -> bytes:
    first = {"index": 0, "id": "call_p", "type": "function", "function": {"name": "apply_patch", "arguments": ""}}
    return b"".join([_chunk({"role": "assistant", "tool_calls": [first]}),
                     *[_chunk({"tool_calls": [{"index": 0, "function": {"arguments": a}}]}) for a in arguments],
                     _chunk(finish="tool_calls"), _chunk(usage={"prompt_tokens": 9, "completion_tokens": 4}),
                     b"data: [DONE]\n\n"])


def test_a_call_to_a_custom_tool_comes_back_as_a_custom_tool_call_streamed_and_whole():
    body = {"model": "m", "input": "patch it", "tools": CODEX_TOOLS}
    patch = '*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch'
    args = json.dumps({"input": patch})
    events = _events(_feed_all(ResponsesToChat("/v1/responses", body, True),
                               _custom_call_stream([args[:10], args[10:30], args[30:]]), []))
    kinds = [e["type"] for e in events]
    assert "response.function_call_arguments.delta" not in kinds
    assert kinds[-4:] == ["response.custom_tool_call_input.delta", "response.custom_tool_call_input.done",
                          "response.output_item.done", "response.completed"]
    added = next(e for e in events if e["type"] == "response.output_item.added")["item"]
    assert added["type"] == "custom_tool_call" and added["call_id"] == "call_p" and added["name"] == "apply_patch"
    done = events[-1]["response"]["output"][0]
    assert done == {"type": "custom_tool_call", "id": "ctc_call_p", "call_id": "call_p", "name": "apply_patch",
                    "input": patch, "status": "completed"}
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    whole = {"id": "x", "choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_q", "type": "function", "function": {"name": "apply_patch", "arguments": args}}]},
        "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
    answer = json.loads(ResponsesToChat("/v1/responses", body, False).whole(200, json.dumps(whole).encode()))
    assert [i["type"] for i in answer["output"]] == ["custom_tool_call"]
    assert answer["output"][0]["input"] == patch and "_arguments" not in answer["output"][0]
