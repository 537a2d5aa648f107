"""The agent dialects, served natively: Anthropic's Messages API (``/v1/messages``,
``/v1/messages/count_tokens``), OpenAI's Responses API (``/v1/responses``) and rerank
(``/v1/rerank``). Which flavor serves which is in :func:`agent_routes`, after the engines:

    ollama     Responses from 0.13.3 (stateless), Messages from 0.14.0 (no count_tokens),
               no rerank: by the configured ``version``
    llamacpp   all four; Responses stateless (``previous_response_id`` refused with 400);
               rerank answers 501 unless the model is a reranker (``--reranking``)
    vllm       all four; Responses stored (``previous_response_id``, ``GET
               /v1/responses/{id}``); rerank exists only for a reranker model (404 otherwise)
    lemonade, omlx   none

``agent_routes=False`` in the config is a build from before any of them. The faults work
as on every generation route: ``cut`` ends without ``message_stop`` / ``response.completed``
(a whole body: ``stop_reason`` null, ``status`` "in_progress"), ``unused`` answers
placeholders, ``drop`` resets mid-stream. Errors use the flavor's shape, except Ollama's
Anthropic errors, which are Anthropic's own (``{"type": "error", "error": {...}}``).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from typing import Any

from aiohttp import web

from hubpool_sim.config import SimConfig
from hubpool_sim.engine import Engine, Generation, silence
from hubpool_sim.replies import call_of, drop_connection, engine_of, finish_json, json_reply, open_stream, unknown_model
from hubpool_sim.script import answer_limit, calls_for
from hubpool_sim.text import continuation, count_or_none, count_tokens
from hubpool_sim.tools import ToolCall

MESSAGES, COUNT_TOKENS, RESPONSES, RERANK = "/v1/messages", "/v1/messages/count_tokens", "/v1/responses", "/v1/rerank"
_OLLAMA_SINCE = {RESPONSES: (0, 13, 3), MESSAGES: (0, 14, 0)}


def _version(text: str) -> tuple[int, ...]:
    match = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(p or 0) for p in match.groups()) if match else (0, 0, 0)


def agent_routes(config: SimConfig) -> set[str]:
    """The agent routes this engine serves natively (see the module docstring)."""
    if not config.agent_routes:
        return set()
    if config.flavor == "ollama":
        have = _version(config.version)
        return {route for route, since in _OLLAMA_SINCE.items() if have >= since}
    if config.flavor == "llamacpp":
        return {MESSAGES, COUNT_TOKENS, RESPONSES, RERANK}
    if config.flavor == "vllm":
        rerank = {RERANK} if any(m.reranker for m in config.models) else set()
        return {MESSAGES, COUNT_TOKENS, RESPONSES} | rerank
    return set()


# -- errors and shared pieces -------------------------------------------------------------

def _error(request: web.Request, status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    engine = engine_of(request)
    if engine.flavor.name == "ollama" and request.path.startswith(MESSAGES):
        return json_reply(status, {"type": "error", "error": {"type": kind, "message": message}})
    return json_reply(status, engine.flavor.error_body(status, message))


def _text_of(content: Any) -> str:
    """Text in a content field of any of the dialects: a string, or blocks/parts carrying
    ``text`` (tool results' content included)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    out = []
    for block in content:
        if isinstance(block, dict):
            if isinstance(block.get("text"), str):
                out.append(block["text"])
            elif "content" in block:
                out.append(_text_of(block["content"]))
            elif isinstance(block.get("output"), str):
                out.append(block["output"])
    return "".join(out)


def _prompt(system: Any, turns: list[tuple[str, Any]]) -> bytes:
    parts = [f"system: {_text_of(system)}\n"] if system else []
    parts += [f"{role}: {_text_of(content)}\n" for role, content in turns]
    return "".join(parts).encode()


def _sse(event: str, payload: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


def _generate(request: web.Request, model: Any, prompt: bytes, max_tokens: int | None,
              turns: list[tuple[Any, Any]]) -> Generation:
    engine = engine_of(request)
    continued, seed = continuation(turns)
    return Generation(model, prompt, engine.config.tokens, answer_limit(engine.config, max_tokens),
                      call_of(request).fault, continued=continued, seed=seed, prose=engine.config.text == "prose")


def _calls_allowed(gen: Generation) -> bool:
    return gen.kind != "unused"


# -- Messages -----------------------------------------------------------------------------

def _messages_body(request: web.Request) -> tuple[dict[str, Any], Any, web.Response | None]:
    engine = engine_of(request)
    body = call_of(request).body
    if not isinstance(body.get("model"), str):
        return body, None, _error(request, 400, "model: Field required")
    model = engine.config.find_model(body["model"])
    if model is None:
        return body, None, unknown_model(request, body["model"])
    if model.embedding or model.reranker:
        return body, None, _error(request, 400, f'"{model.id}" does not support chat')
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        return body, None, _error(request, 400, "messages: Field required")
    return body, model, None


def _messages_turns(body: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(m.get("role", "user"), m.get("content")) for m in body["messages"] if isinstance(m, dict)]


def _ends_in_tool_result(messages: list[Any]) -> bool:
    last = messages[-1] if messages else None
    content = last.get("content") if isinstance(last, dict) else None
    return isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)


async def messages(request: web.Request) -> web.StreamResponse:
    body, model, refused = _messages_body(request)
    if refused is not None:
        return refused
    engine = engine_of(request)
    turns = _messages_turns(body)
    gen = _generate(request, model, _prompt(body.get("system"), turns), count_or_none(body.get("max_tokens")), turns)
    calls = calls_for(engine.config, body.get("tools"), body["messages"], _ends_in_tool_result(body["messages"])) \
        if _calls_allowed(gen) else []
    message_id = f"msg_{uuid.uuid4().hex[:24]}"
    async with engine.serving(gen):
        if body.get("stream") is True:
            return await _messages_stream(request, engine, gen, message_id, calls)
        text = "".join([token async for token in engine.decode(gen)])
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if not calls else []
    content += [{"type": "tool_use", "id": f"toolu_{c.call_id}", "name": c.name, "input": c.arguments} for c in calls]
    stop = None if gen.kind == "cut" else _stop_reason(gen, calls)
    answer = {"id": message_id, "type": "message", "role": "assistant", "model": model.id, "content": content,
              "stop_reason": stop, "stop_sequence": None,
              "usage": {"input_tokens": gen.prompt_tokens, "output_tokens": gen.emitted_tokens}}
    return await finish_json(request, answer, dropped=gen.kind == "drop")


def _stop_reason(gen: Generation, calls: list[ToolCall]) -> str:
    if calls:
        return "tool_use"
    return "max_tokens" if gen.finish_reason == "length" else "end_turn"


async def _messages_stream(request: web.Request, engine: Engine, gen: Generation, message_id: str,
                           calls: list[ToolCall]) -> web.StreamResponse:
    response = await open_stream(request, "text/event-stream")
    start = {"id": message_id, "type": "message", "role": "assistant", "model": gen.model.id, "content": [],
             "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": gen.prompt_tokens, "output_tokens": 0}}
    await response.write(_sse("message_start", {"type": "message_start", "message": start}))
    if calls:
        _ = [token async for token in engine.decode(gen, stall=False)]
        events = []
        for index, call in enumerate(calls):
            block = {"type": "tool_use", "id": f"toolu_{call.call_id}", "name": call.name, "input": {}}
            events.append(("content_block_start", {"type": "content_block_start", "index": index,
                                                   "content_block": block}))
            events += [("content_block_delta", {"type": "content_block_delta", "index": index,
                                                 "delta": {"type": "input_json_delta", "partial_json": piece}})
                       for piece in call.pieces()]
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        if gen.kind in ("cut", "drop"):
            events = events[: max(1, len(events) // 2)]
        stall_at = 1 + calls[0].pieces_before_stall() if gen.kind == "stall" else None
        for i, (name, payload) in enumerate(events):
            if i == stall_at:  # inside the first call's arguments
                await silence()
            await response.write(_sse(name, payload))
    else:
        await response.write(_sse("content_block_start", {"type": "content_block_start", "index": 0,
                                                          "content_block": {"type": "text", "text": ""}}))
        await response.write(_sse("ping", {"type": "ping"}))
        async for token in engine.decode(gen):
            await response.write(_sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                              "delta": {"type": "text_delta", "text": token}}))
        if gen.kind not in ("cut", "drop"):
            await response.write(_sse("content_block_stop", {"type": "content_block_stop", "index": 0}))
    if gen.kind == "cut":
        await response.write_eof()
        return response
    if gen.kind == "drop":
        await drop_connection(request)
    delta = {"stop_reason": _stop_reason(gen, calls), "stop_sequence": None}
    await response.write(_sse("message_delta", {"type": "message_delta", "delta": delta,
                                                "usage": {"output_tokens": gen.emitted_tokens}}))
    await response.write(_sse("message_stop", {"type": "message_stop"}))
    await response.write_eof()
    return response


async def count_message_tokens(request: web.Request) -> web.Response:
    body, _model, refused = _messages_body(request)
    if refused is not None:
        return refused
    return json_reply(200, {"input_tokens": count_tokens(_prompt(body.get("system"), _messages_turns(body)))})


# -- Responses ----------------------------------------------------------------------------

def _input_items(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _items_turns(items: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    turns = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            turns.append((item.get("role", "user"), item.get("content")))
        elif kind == "function_call":
            turns.append(("assistant", item.get("arguments")))
        elif kind == "function_call_output":
            turns.append(("tool", item.get("output")))
    return turns


async def responses(request: web.Request) -> web.StreamResponse:
    engine = engine_of(request)
    body = call_of(request).body
    if not isinstance(body.get("model"), str):
        return _error(request, 400, "model: Field required")
    if "input" not in body:
        return _error(request, 400, "'input' is required")
    model = engine.config.find_model(body["model"])
    if model is None:
        return unknown_model(request, body["model"])
    if model.embedding or model.reranker:
        return _error(request, 400, f'"{model.id}" does not support chat')
    items = _input_items(body["input"])
    history: list[dict[str, Any]] = []
    previous = body.get("previous_response_id")
    if previous is not None:
        if engine.flavor.name != "vllm":
            return _error(request, 400, f"{engine.flavor.name} does not support 'previous_response_id'.")
        stored = engine.responses.get(previous)
        if stored is None:
            return _error(request, 404, f"Response with id '{previous}' not found.")
        history = stored["_history"]
    conversation = history + items
    turns = _items_turns(conversation)
    prompt = _prompt(body.get("instructions"), turns)
    gen = _generate(request, model, prompt, count_or_none(body.get("max_output_tokens")), turns)
    last = conversation[-1] if conversation else {}
    calls = calls_for(engine.config, body.get("tools"), conversation, last.get("type") == "function_call_output") \
        if _calls_allowed(gen) else []
    response_id = f"resp_{uuid.uuid4().hex[:24]}"
    async with engine.serving(gen):
        if body.get("stream") is True:
            return await _responses_stream(request, engine, gen, body, response_id, calls, conversation)
        text = "".join([token async for token in engine.decode(gen)])
    status = "in_progress" if gen.kind == "cut" else None
    answer = _response_object(body, response_id, gen, _output(text, calls), status)
    _store(engine, body, answer, conversation)
    return await finish_json(request, answer, dropped=gen.kind == "drop")


def _output(text: str, calls: list[ToolCall]) -> list[dict[str, Any]]:
    if calls:
        return [{"type": "function_call", "id": f"fc_{c.call_id}", "call_id": f"call_{c.call_id}", "name": c.name,
                 "arguments": c.json, "status": "completed"} for c in calls]
    return [{"type": "message", "id": f"msg_{uuid.uuid4().hex[:24]}", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": text, "annotations": []}]}]


def _response_object(body: dict[str, Any], response_id: str, gen: Generation, output: list[dict[str, Any]],
                     status: str | None) -> dict[str, Any]:
    if status is None:
        status = "incomplete" if gen.finish_reason == "length" else "completed"
    return {
        "id": response_id, "object": "response", "created_at": int(time.time()), "status": status,
        "model": gen.model.id, "output": output, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.get("instructions"), "previous_response_id": body.get("previous_response_id"),
        "parallel_tool_calls": True, "tool_choice": "auto", "tools": body.get("tools") or [],
        "store": body.get("store") is not False, "metadata": {}, "text": {"format": {"type": "text"}},
        "usage": {"input_tokens": gen.prompt_tokens, "output_tokens": gen.emitted_tokens,
                  "total_tokens": gen.prompt_tokens + gen.emitted_tokens,
                  "input_tokens_details": {"cached_tokens": gen.cached_tokens},
                  "output_tokens_details": {"reasoning_tokens": 0}},
    }


def _store(engine: Engine, body: dict[str, Any], answer: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
    """vLLM keeps a response (store, the default) so a later turn can continue from it."""
    if engine.flavor.name == "vllm" and body.get("store") is not False and answer["status"] != "in_progress":
        engine.responses[answer["id"]] = {**answer, "_history": conversation + answer["output"]}


async def get_response(request: web.Request) -> web.Response:
    engine = engine_of(request)
    stored = engine.responses.get(request.match_info["response_id"])
    if stored is None:
        return _error(request, 404, f"Response with id '{request.match_info['response_id']}' not found.")
    return json_reply(200, {k: v for k, v in stored.items() if k != "_history"})


async def _responses_stream(request: web.Request, engine: Engine, gen: Generation, body: dict[str, Any],
                            response_id: str, calls: list[ToolCall],
                            conversation: list[dict[str, Any]]) -> web.StreamResponse:
    response = await open_stream(request, "text/event-stream")
    seq = 0

    async def emit(kind: str, payload: dict[str, Any]) -> None:
        nonlocal seq
        await response.write(_sse(kind, {"type": kind, "sequence_number": seq, **payload}))
        seq += 1

    shell = {**_response_object(body, response_id, gen, [], "in_progress"), "usage": None}
    await emit("response.created", {"response": shell})
    await emit("response.in_progress", {"response": shell})
    cut = gen.kind in ("cut", "drop")
    if calls:
        _ = [token async for token in engine.decode(gen, stall=False)]
        output = _output("", calls)
        for index, (call, item) in enumerate(zip(calls, output, strict=True)):
            await emit("response.output_item.added", {"output_index": index,
                                                      "item": {**item, "arguments": "", "status": "in_progress"}})
            pieces = call.pieces()
            for at, piece in enumerate(pieces[: max(1, len(pieces) // 2)] if cut else pieces):
                if gen.kind == "stall" and index == 0 and at == call.pieces_before_stall():
                    await silence()  # inside the first call's arguments
                await emit("response.function_call_arguments.delta",
                           {"item_id": item["id"], "output_index": index, "delta": piece})
            if cut:
                break
            await emit("response.function_call_arguments.done",
                       {"item_id": item["id"], "output_index": index, "arguments": call.json})
            await emit("response.output_item.done", {"output_index": index, "item": item})
    else:
        item_id = f"msg_{uuid.uuid4().hex[:24]}"
        await emit("response.output_item.added", {"output_index": 0, "item": {
            "type": "message", "id": item_id, "role": "assistant", "status": "in_progress", "content": []}})
        await emit("response.content_part.added", {"item_id": item_id, "output_index": 0, "content_index": 0,
                                                   "part": {"type": "output_text", "text": "", "annotations": []}})
        text = ""
        async for token in engine.decode(gen):
            text += token
            await emit("response.output_text.delta", {"item_id": item_id, "output_index": 0, "content_index": 0,
                                                     "delta": token, "logprobs": []})
        part = {"type": "output_text", "text": text, "annotations": []}
        output = [{"type": "message", "id": item_id, "role": "assistant", "status": "completed", "content": [part]}]
        if not cut:
            await emit("response.output_text.done", {"item_id": item_id, "output_index": 0, "content_index": 0,
                                                    "text": text, "logprobs": []})
            await emit("response.content_part.done", {"item_id": item_id, "output_index": 0, "content_index": 0,
                                                     "part": part})
            await emit("response.output_item.done", {"output_index": 0, "item": output[0]})
    if gen.kind == "cut":
        await response.write_eof()
        return response
    if gen.kind == "drop":
        await drop_connection(request)
    final = _response_object(body, response_id, gen, output, None)
    _store(engine, body, final, conversation)
    await emit("response.completed" if final["status"] == "completed" else "response.incomplete", {"response": final})
    await response.write_eof()
    return response


# -- rerank -------------------------------------------------------------------------------

def _relevance(query: str, document: str) -> float:
    """Shared words, and a stable tie-break from the text: a predictable order."""
    words = set(query.lower().split())
    shared = len(words & set(document.lower().split())) / max(1, len(words))
    jitter = int(hashlib.sha256(f"{query}\0{document}".encode()).hexdigest()[:6], 16) / 0xFFFFFF / 100
    return round(shared + jitter, 6)


async def rerank(request: web.Request) -> web.Response:
    engine = engine_of(request)
    body = call_of(request).body
    model = engine.config.find_model(body.get("model"))
    if engine.flavor.name == "llamacpp" and not (model and model.reranker):
        return _error(request, 501, "This server does not support reranking. Start it with `--reranking`",
                      "not_supported_error")
    query = body.get("query")
    if not isinstance(query, str):
        return _error(request, 400, '"query" must be provided')
    documents = body.get("documents", body.get("texts"))
    if not isinstance(documents, list) or not documents:
        return _error(request, 400, '"documents" must be a non-empty string array')
    if model is None:
        return unknown_model(request, body.get("model"))
    texts = [d if isinstance(d, str) else _text_of([d]) for d in documents]
    gen = Generation(model, "\n".join([query, *texts]).encode(), 1, fault=call_of(request).fault, cacheable=False)
    async with engine.serving(gen):
        pass
    scored = sorted(((i, _relevance(query, t)) for i, t in enumerate(texts)), key=lambda r: -r[1])
    top_n = count_or_none(body.get("top_n")) or len(texts)
    results = []
    for index, score in scored[:top_n]:
        row: dict[str, Any] = {"index": index, "relevance_score": score}
        if body.get("return_documents") is not False:
            row["document"] = {"text": texts[index]}
        results.append(row)
    tokens = count_tokens("\n".join([query, *texts]))
    answer = {"id": f"rerank-{uuid.uuid4().hex[:16]}", "model": model.id, "results": results,
              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    return await finish_json(request, answer, dropped=gen.kind == "drop")
