"""The stream faults hubpool's watchdogs are tested against (issue 28): headers then
silence, silence mid-stream, a loop, and the deterministic "prose" text that an engine
continues from a trailing assistant message, byte for byte, in every dialect."""

from __future__ import annotations

import json

import httpx
import pytest

from hubpool_sim import SimConfig, SimModel, run_in_thread
from hubpool_sim.testing import ndjson_lines, sse_events, wait_until
from hubpool_sim.text import LOOP_SENTENCE

CHAT = "llama3.2:3b"
QUESTION = "Why is the sky blue?"


def _body(dialect: str, *, prefix: str | None = None, tokens: int | None = None, stream: bool = True) -> tuple[str, dict]:
    """The route and body asking QUESTION in ``dialect``, continuing ``prefix`` if given."""
    if dialect == "responses":
        items: list = [{"type": "message", "role": "user", "content": QUESTION}]
        if prefix is not None:
            items.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": prefix}]})
        body = {"model": CHAT, "input": items, "stream": stream}
        if tokens:
            body["max_output_tokens"] = tokens
        return "/v1/responses", body
    messages: list = [{"role": "user", "content": QUESTION}]
    if prefix is not None:
        messages.append({"role": "assistant", "content": prefix})
    body = {"model": CHAT, "messages": messages, "stream": stream}
    if dialect == "native":
        if tokens:
            body["options"] = {"num_predict": tokens}
        return "/api/chat", body
    if tokens:
        body["max_tokens"] = tokens
    return ("/v1/messages" if dialect == "messages" else "/v1/chat/completions"), body


def _text(dialect: str, raw: str) -> str:
    """The answer's text in a stream of ``dialect``."""
    if dialect == "native":
        return "".join(line["message"]["content"] for line in ndjson_lines(raw))
    if dialect == "openai":
        return "".join(c["delta"].get("content") or "" for e in sse_events(raw) if e != "[DONE]" for c in e["choices"])
    out = []
    for _name, event in _sse_with_events(raw):
        if dialect == "messages" and event["type"] == "content_block_delta":
            out.append(event["delta"]["text"])
        elif dialect == "responses" and event["type"] == "response.output_text.delta":
            out.append(event["delta"])
    return "".join(out)


def _sse_with_events(raw: str) -> list[tuple[str | None, dict]]:
    events = []
    for block in raw.split("\n\n"):
        name, data = None, None
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        if data is not None and data != "[DONE]":
            events.append((name, json.loads(data)))
    return events


DIALECTS = ("openai", "native", "messages", "responses")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_prose_is_the_same_answer_everywhere_and_continues_byte_for_byte(dialect):
    """The same question gets the same prose from every flavor and dialect; asked to continue
    any prefix of it (a token's edge or inside a token), an engine sends exactly the rest."""
    flavor = "ollama" if dialect == "native" else "llamacpp"
    with run_in_thread(SimConfig(flavor=flavor, models=[SimModel(CHAT)], text="prose", tokens=40)) as sim, \
            run_in_thread(SimConfig(flavor="vllm", models=[SimModel(CHAT)], text="prose", tokens=40)) as other:
        route, body = _body(dialect)
        whole = _text(dialect, httpx.post(sim.url + route, json=body).text)
        assert len(whole.split()) == 40 and not whole.startswith("tok")
        if dialect != "native":  # the same words from another engine and another dialect
            assert _text("openai", httpx.post(other.url + "/v1/chat/completions",
                                              json=_body("openai")[1]).text) == whole
        for cut in (1, len(whole) // 3, len(whole) // 2 + 1, len(whole) - 1):
            route, body = _body(dialect, prefix=whole[:cut])
            rest = _text(dialect, httpx.post(sim.url + route, json=body).text)
            assert whole[:cut] + rest == whole, (cut, rest)


def test_a_continuation_with_a_token_budget_spends_it_on_the_rest():
    with run_in_thread(SimConfig(models=[SimModel(CHAT)], text="prose")) as sim:
        whole = _text("openai", httpx.post(sim.url + "/v1/chat/completions", json=_body("openai", tokens=30)[1]).text)
        head = " ".join(whole.split(" ")[:12])
        rest = _text("openai", httpx.post(sim.url + "/v1/chat/completions",
                                          json=_body("openai", prefix=head, tokens=18)[1]).text)
        assert head + rest == whole


def test_the_default_tokens_continue_too():
    with run_in_thread(SimConfig(models=[SimModel(CHAT)], tokens=10)) as sim:
        rest = _text("openai", httpx.post(sim.url + "/v1/chat/completions",
                                          json=_body("openai", prefix="tok0 tok1 tok2 to")[1]).text)
        assert rest == "k3 tok4 tok5 tok6 tok7 tok8 tok9"


def _read_until_silent(url: str, route: str, body: dict, quiet_s: float = 0.6) -> tuple[int, str, bool]:
    """(status, what arrived, whether the stream went quiet with its connection open)."""
    got = b""
    with httpx.stream("POST", url + route, json=body, timeout=httpx.Timeout(5, read=quiet_s)) as response:
        try:
            for chunk in response.iter_raw():
                got += chunk
        except httpx.ReadTimeout:
            return response.status_code, got.decode(), True
    return response.status_code, got.decode(), False


@pytest.mark.parametrize("dialect", DIALECTS)
def test_mute_sends_headers_and_the_opening_then_nothing(dialect):
    flavor = "ollama" if dialect == "native" else "llamacpp"
    with run_in_thread(SimConfig(flavor=flavor, models=[SimModel(CHAT)], faults=["mute"])) as sim:
        route, body = _body(dialect)
        status, got, silent = _read_until_silent(sim.url, route, body)
        assert status == 200 and silent
        assert _text(dialect, got) == ""
        if dialect == "openai":  # a role-only chunk, as llama-server sends at once
            assert [e["choices"][0]["delta"] for e in sse_events(got)] == [{"role": "assistant", "content": ""}]
        elif dialect == "messages":
            assert [name for name, _ in _sse_with_events(got)] == ["message_start", "content_block_start", "ping"]
        elif dialect == "responses":
            assert [name for name, _ in _sse_with_events(got)][:2] == ["response.created", "response.in_progress"]
        else:
            assert got == ""
        assert wait_until(lambda: sim.stats()["aborted"] == 1)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_stall_sends_half_the_answer_then_nothing(dialect):
    flavor = "ollama" if dialect == "native" else "llamacpp"
    with run_in_thread(SimConfig(flavor=flavor, models=[SimModel(CHAT)], tokens=10, faults=["stall@:1"])) as sim:
        route, body = _body(dialect)
        status, got, silent = _read_until_silent(sim.url, route, body)
        assert status == 200 and silent
        assert _text(dialect, got) == "tok0 tok1 tok2 tok3 tok4"
        # the fault was for one request: the next is whole
        assert _text(dialect, httpx.post(sim.url + route, json=body).text).endswith("tok9")


#: one tool, so the answer is one call whose arguments stream in pieces
TOOL_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
TOOLS = {"openai": [{"type": "function", "function": {"name": "read_file", "parameters": TOOL_SCHEMA}}],
         "messages": [{"name": "read_file", "input_schema": TOOL_SCHEMA}],
         "responses": [{"type": "function", "name": "read_file", "parameters": TOOL_SCHEMA}]}


def _arguments(dialect: str, raw: str) -> tuple[list[str], str]:
    """(the tool names a stream opened, the argument text it streamed)."""
    names, args = [], ""
    if dialect == "openai":
        for event in sse_events(raw):
            if event == "[DONE]" or not event["choices"]:
                continue
            for call in event["choices"][0]["delta"].get("tool_calls") or []:
                names += [call["function"]["name"]] if call["function"].get("name") else []
                args += call["function"].get("arguments") or ""
        return names, args
    for _name, event in _sse_with_events(raw):
        if event["type"] == "content_block_start" and event["content_block"]["type"] == "tool_use":
            names.append(event["content_block"]["name"])
        elif event["type"] == "content_block_delta" and event["delta"]["type"] == "input_json_delta":
            args += event["delta"]["partial_json"]
        elif event["type"] == "response.output_item.added" and event["item"]["type"] == "function_call":
            names.append(event["item"]["name"])
        elif event["type"] == "response.function_call_arguments.delta":
            args += event["delta"]
    return names, args


@pytest.mark.parametrize("dialect", ["openai", "messages", "responses"])
def test_stall_in_a_tool_call_goes_silent_inside_its_arguments(dialect):
    with run_in_thread(SimConfig(flavor="llamacpp", models=[SimModel(CHAT)], faults=["stall@:1"])) as sim:
        route, body = _body(dialect)
        body["tools"] = TOOLS[dialect]
        status, got, silent = _read_until_silent(sim.url, route, body)
        assert status == 200 and silent
        names, args = _arguments(dialect, got)
        whole = '{"path":"tok0 tok1"}'
        assert names == ["read_file"] and args and whole.startswith(args) and args != whole  # inside the JSON
        assert wait_until(lambda: sim.stats()["aborted"] == 1)
        # the fault was for one request: the next call is whole
        assert _arguments(dialect, httpx.post(sim.url + route, json=body).text) == (["read_file"], whole)


def test_silent_faults_on_a_whole_answer_send_no_headers():
    with run_in_thread(SimConfig(models=[SimModel(CHAT)], faults=["stall"])) as sim:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(sim.url + "/api/chat", json=_body("native", stream=False)[1], timeout=httpx.Timeout(5, read=0.4))


@pytest.mark.parametrize("dialect", DIALECTS)
def test_loop_repeats_one_sentence(dialect):
    flavor = "ollama" if dialect == "native" else "llamacpp"
    with run_in_thread(SimConfig(flavor=flavor, models=[SimModel(CHAT)], faults=["loop"])) as sim:
        route, body = _body(dialect, tokens=6 + 9 * 20)
        text = _text(dialect, httpx.post(sim.url + route, json=body).text)
        sentence = "".join(LOOP_SENTENCE)
        assert text == "Let me think about this." + sentence * 20
