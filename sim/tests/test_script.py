"""The scripted model (``tool_script``): the named call at each step, in every dialect, then
a short answer that ends on its own whatever max_tokens says."""

from __future__ import annotations

import json

import httpx
import pytest

from hubpool_sim import SimConfig, SimModel, run_in_thread

MODEL = "coder:8b"
READ = {"Read": {"file_path": "/w/notes.txt"}, "read": {"filePath": "/w/notes.txt"},
        "exec_command": {"cmd": "cat notes.txt"}}
SCRIPT = [READ, {"Bash": {"command": "ls"}}]


def _sim(flavor: str = "llamacpp", script=SCRIPT, **kwargs):
    return run_in_thread(SimConfig(flavor=flavor, models=[SimModel(MODEL, window=65536)], tool_script=script,
                                   **kwargs))


def _messages_tools(*names):
    return [{"name": n, "description": "d", "input_schema": {"type": "object", "properties": {"x": {"type": "string"}},
                                                             "required": ["x"]}} for n in names]


def test_messages_each_step_calls_its_tool_then_the_model_answers_and_stops_on_its_own():
    tools = _messages_tools("Agent", "Bash", "Read", "Write")
    turns = [{"role": "user", "content": "read the notes"}]
    with _sim(tokens=3) as sim:
        first = httpx.post(sim.url + "/v1/messages", json={"model": MODEL, "max_tokens": 32000, "tools": tools,
                                                            "messages": turns}).json()
        # the step's first name the request offers, with the script's arguments, and only that one
        assert [(b["type"], b["name"], b["input"]) for b in first["content"]] == \
            [("tool_use", "Read", {"file_path": "/w/notes.txt"})]
        assert first["stop_reason"] == "tool_use"
        turns += [{"role": "assistant", "content": first["content"]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": first["content"][0]["id"],
                                                "content": "the notes"}]}]
        second = httpx.post(sim.url + "/v1/messages", json={"model": MODEL, "max_tokens": 32000, "tools": tools,
                                                             "messages": turns}).json()
        assert [(b["name"], b["input"]) for b in second["content"]] == [("Bash", {"command": "ls"})]
        turns += [{"role": "assistant", "content": second["content"]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": second["content"][0]["id"],
                                                "content": "notes.txt"}]}]
        third = httpx.post(sim.url + "/v1/messages", json={"model": MODEL, "max_tokens": 32000, "tools": tools,
                                                            "messages": turns}).json()
    # past the script: text of `tokens` tokens and a natural end, not 32000 tokens and max_tokens
    assert third["content"] == [{"type": "text", "text": "tok0 tok1 tok2"}]
    assert third["stop_reason"] == "end_turn" and third["usage"]["output_tokens"] == 3


def test_responses_stream_calls_the_step_tool_and_counts_function_call_outputs():
    tools = [{"type": "function", "name": n, "parameters": {"type": "object", "properties": {}}}
             for n in ("write_stdin", "exec_command")] + [{"type": "web_search"}]
    with _sim() as sim:
        text = httpx.post(sim.url + "/v1/responses", json={"model": MODEL, "stream": True, "tools": tools,
                                                            "input": "read the notes"}).text
        events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
        done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
        assert [(i["type"], i["name"], json.loads(i["arguments"])) for i in done] == \
            [("function_call", "exec_command", {"cmd": "cat notes.txt"})]
        history = [{"type": "message", "role": "user", "content": "read the notes"}, done[0],
                   {"type": "function_call_output", "call_id": done[0]["call_id"], "output": "the notes"}]
        # step 2 names only Bash, which Codex does not offer: text
        answer = httpx.post(sim.url + "/v1/responses", json={"model": MODEL, "tools": tools, "input": history}).json()
    assert answer["output"][0]["type"] == "message" and answer["status"] == "completed"


@pytest.mark.parametrize("flavor", ["llamacpp", "ollama"])
def test_chat_calls_the_step_tool_and_an_empty_script_never_calls(flavor):
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
             for n in ("bash", "read", "task")]
    turns = [{"role": "user", "content": "read the notes"}]
    with _sim(flavor) as sim:
        first = httpx.post(sim.url + "/v1/chat/completions", json={"model": MODEL, "max_tokens": 32000,
                                                                    "tools": tools, "messages": turns}).json()
        call = first["choices"][0]["message"]["tool_calls"]
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in call] == \
            [("read", {"filePath": "/w/notes.txt"})]
        turns += [first["choices"][0]["message"], {"role": "tool", "tool_call_id": call[0]["id"], "content": "x"}]
        second = httpx.post(sim.url + "/v1/chat/completions", json={"model": MODEL, "max_tokens": 32000,
                                                                     "tools": tools, "messages": turns}).json()
        assert second["choices"][0]["finish_reason"] == "stop" and second["choices"][0]["message"]["content"]
    with _sim(flavor, script=[]) as sim:
        quiet = httpx.post(sim.url + "/v1/chat/completions", json={"model": MODEL, "max_tokens": 32000,
                                                                    "tools": tools, "messages": turns[:1]}).json()
    assert quiet["choices"][0]["finish_reason"] == "stop" and "tool_calls" not in quiet["choices"][0]["message"]
    assert quiet["usage"]["completion_tokens"] == 8  # the default answer length, not max_tokens


def test_the_script_changes_at_runtime_and_a_malformed_one_is_refused():
    with _sim(script=None) as sim:
        tools = _messages_tools("Read", "Write")
        body = {"model": MODEL, "max_tokens": 4, "tools": tools, "messages": [{"role": "user", "content": "go"}]}
        default = httpx.post(sim.url + "/v1/messages", json=body).json()
        assert [b["name"] for b in default["content"]] == ["Read", "Write"]  # the default model's two calls
        assert httpx.post(sim.url + "/_sim/config", json={"tool_script": [{"Write": {"x": "1"}}]}).status_code == 200
        scripted = httpx.post(sim.url + "/v1/messages", json=body).json()
        assert [(b["name"], b["input"]) for b in scripted["content"]] == [("Write", {"x": "1"})]
        refused = httpx.post(sim.url + "/_sim/config", json={"tool_script": ["Read"]})
        assert refused.status_code == 400 and "tool_script" in refused.json()["error"]
        assert httpx.post(sim.url + "/_sim/config", json={"tool_script": None}).status_code == 200
        assert [b["name"] for b in httpx.post(sim.url + "/v1/messages", json=body).json()["content"]] == \
            ["Read", "Write"]
