"""With poolStreamResume 1, a stream cut where a continuation is not sound is not resumed
(issue 28 item 4): it ends with the dialect's error event, never a silent close that a client
reads as a finished answer. Through two running nodes beside simulated engines:

- cut inside a tool call's arguments — the engine stalls there (the simulator's ``stall``
  fault on a tool-call answer) or resets its connection there (``drop``) — for OpenAI chat,
  Ollama native, Anthropic Messages and Responses, natively and translated;
- cut on a route the node does not continue (legacy completions, Ollama's generate).

In every case hub-b, the next candidate, is never asked: the answer is not moved."""

from __future__ import annotations

import json
from contextlib import ExitStack

import httpx
import pytest
from streams import (
    NATIVE_MODEL,
    OLLAMA_MODEL,
    error_of,
    events,
    forgive,
    request,
    row,
    settings,
    sim_for,
    start_pool,
)

STALL_MS = 800
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
#: the one call every engine answers with (tools.py builds its arguments from the schema)
WHOLE_ARGUMENTS = '{"path":"tok0 tok1"}'
GENERATION = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses", "/api/chat", "/api/generate")

#: (dialect, model): natively on a llama-server, and translated to chat completions (native on
#: the llama-server; Messages and Responses on an Ollama from before the agent dialects)
CASES = [("openai", NATIVE_MODEL), ("openai", OLLAMA_MODEL), ("native", NATIVE_MODEL), ("messages", NATIVE_MODEL),
         ("messages", OLLAMA_MODEL), ("responses", NATIVE_MODEL), ("responses", OLLAMA_MODEL)]
CASE_IDS = ["chat", "chat-ollama", "native-translated", "messages", "messages-translated", "responses",
            "responses-translated"]


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    with ExitStack() as stack:
        nodes, sims = start_pool(stack, tmp_path_factory.mktemp("unresumable"), tokens=40, text="prose")
        settings(nodes["hub-a"], poolStreamStallMs=STALL_MS, poolStreamResume=1)
        yield nodes, sims


@pytest.fixture(autouse=True)
def clean(pool):
    """Each case starts with no fault armed, its counters at zero and no engine struck."""
    nodes, sims = pool
    forgive(nodes)
    for sim in sims.values():
        sim.reset()


def _with_tools(dialect: str, model: str) -> tuple[str, dict]:
    route, body = request(dialect, model, tokens=40)
    if dialect == "messages":
        body["tools"] = [{"name": "read_file", "input_schema": SCHEMA}]
    elif dialect == "responses":
        body["tools"] = [{"type": "function", "name": "read_file", "parameters": SCHEMA}]
    else:  # chat completions and Ollama's native chat name tools alike
        body["tools"] = [{"type": "function", "function": {"name": "read_file", "parameters": SCHEMA}}]
    return route, body


def _call_seen(dialect: str, raw: bytes) -> tuple[list[str], str]:
    """(the tools the app's stream named, the argument JSON it carried) — whole calls for
    Ollama's native dialect, whose calls arrive whole."""
    names: list[str] = []
    args = ""
    if dialect == "native":
        for line in raw.decode().splitlines():
            for call in (json.loads(line).get("message") or {}).get("tool_calls") or []:
                names.append(call["function"]["name"])
                args += json.dumps(call["function"]["arguments"], separators=(",", ":"))
        return names, args
    for _name, data in events(raw):
        if not isinstance(data, dict):
            continue
        kind = data.get("type")
        if dialect == "openai":
            for choice in data.get("choices") or []:
                for call in (choice.get("delta") or {}).get("tool_calls") or []:
                    fn = call.get("function") or {}
                    names += [fn["name"]] if fn.get("name") else []
                    args += fn.get("arguments") or ""
        elif kind == "content_block_start" and data["content_block"]["type"] == "tool_use":
            names.append(data["content_block"]["name"])
        elif kind == "content_block_delta" and data["delta"]["type"] == "input_json_delta":
            args += data["delta"]["partial_json"]
        elif kind == "response.output_item.added" and data["item"]["type"] == "function_call":
            names.append(data["item"]["name"])
        elif kind == "response.function_call_arguments.delta":
            args += data["delta"]
    return names, args


def _generations(sim) -> int:
    by_path = sim.stats()["by_path"]
    return sum(by_path.get(route, 0) for route in GENERATION)


def _post(node, route: str, body: dict) -> httpx.Response:
    with httpx.Client(base_url=node.url, timeout=30, trust_env=False) as c:
        return c.post(route, json=body)


@pytest.mark.parametrize("fault", ["stall", "drop"])
@pytest.mark.parametrize("dialect,model", CASES, ids=CASE_IDS)
def test_a_stream_cut_inside_a_tool_call_ends_with_the_error_event(pool, dialect, model, fault):
    nodes, sims = pool
    route, body = _with_tools(dialect, model)
    whole = _post(nodes["hub-a"], route, body)  # the same request, uninterrupted: one whole call
    assert whole.status_code == 200 and error_of(dialect, whole.content) is None
    assert _call_seen(dialect, whole.content) == (["read_file"], WHOLE_ARGUMENTS)
    for sim in sims.values():
        sim.reset()
    sim_for(sims, "a", model).add_fault(fault, count=1)

    response = _post(nodes["hub-a"], route, body)

    assert response.status_code == 200
    names, args = _call_seen(dialect, response.content)
    if dialect == "native":
        # a translated native stream gets a call only once it is whole: the app saw none of it
        assert (names, args) == ([], "")
    else:  # the call's name and part of its JSON reached the app, never the whole of it
        assert names == ["read_file"] and args and WHOLE_ARGUMENTS.startswith(args) and args != WHOLE_ARGUMENTS
    message = error_of(dialect, response.content)
    assert message is not None, response.content[-400:]
    assert ("no content for" in message) if fault == "stall" else ("stream broke" in message), message
    logged = row(nodes["hub-a"], response.headers["x-hub-pool-request-id"])
    assert logged["outcome"] == "failed" and "resumedFrom" not in logged, logged
    assert logged["reason"].startswith("stalled (no content for" if fault == "stall" else "truncated-upstream (")
    # not moved: hub-b's engines were never asked to continue it
    assert _generations(sim_for(sims, "b", NATIVE_MODEL)) == 0 and _generations(sim_for(sims, "b", OLLAMA_MODEL)) == 0
    if dialect == "responses":  # the failure continues the app's response: its id, the next sequence number
        seen = [d for _n, d in events(response.content) if isinstance(d, dict)]
        assert [d["type"] for d in seen].count("response.created") == 1
        assert seen[-1]["type"] == "response.failed"
        assert seen[-1]["response"]["id"] == seen[0]["response"]["id"]
        assert [d["sequence_number"] for d in seen] == list(range(len(seen)))
    elif dialect == "messages":
        assert [n for n, _d in events(response.content)].count("message_start") == 1


#: (route, model, the error event's reader): routes whose streams the node does not continue
UNRESUMABLE = [("/v1/completions", NATIVE_MODEL, "openai"), ("/api/generate", OLLAMA_MODEL, "native")]


@pytest.mark.parametrize("fault", ["stall", "drop"])
@pytest.mark.parametrize("route,model,dialect", UNRESUMABLE, ids=["completions", "generate"])
def test_a_route_that_is_not_continued_ends_with_the_error_event(pool, route, model, dialect, fault):
    nodes, sims = pool
    sim_for(sims, "a", model).add_fault(fault, count=1)
    body = {"model": model, "prompt": "Why is the sky blue?", "stream": True}
    body.update({"options": {"num_predict": 40}} if route == "/api/generate" else {"max_tokens": 40})

    response = _post(nodes["hub-a"], route, body)

    assert response.status_code == 200
    text = "".join(json.loads(line).get("response", "") for line in response.text.splitlines()) \
        if dialect == "native" else \
        "".join(c.get("text") or "" for _n, d in events(response.content) if isinstance(d, dict)
                for c in d.get("choices") or [])
    assert len(text.split()) == 20  # the first half, then the cut
    message = error_of(dialect, response.content)
    assert message is not None, response.content[-400:]
    assert ("no content for" in message) if fault == "stall" else ("stream broke" in message), message
    logged = row(nodes["hub-a"], response.headers["x-hub-pool-request-id"])
    assert logged["outcome"] == "failed" and "resumedFrom" not in logged, logged
    assert _generations(sim_for(sims, "b", model)) == 0
