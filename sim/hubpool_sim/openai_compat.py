"""The OpenAI-compatible dialect: /v1/chat/completions, /v1/completions, /v1/embeddings,
/v1/models (under /api/v1 on Lemonade), with each engine's additions.

Per flavor: vLLM adds ``usage.prompt_tokens_details.cached_tokens`` only when the prompt
cache hit; llama-server always adds it, and ``timings`` on the body / final chunk when
timings are on; Ollama's shim reports only the prompt tokens it evaluated, as Ollama does.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from aiohttp import web

from hubpool_sim.engine import Engine, Generation, silence
from hubpool_sim.faults import verdict_message
from hubpool_sim.flavors import context_overflow
from hubpool_sim.replies import (
    call_of,
    drop_connection,
    engine_of,
    error_reply,
    finish_json,
    json_reply,
    open_stream,
    sse,
    unknown_model,
)
from hubpool_sim.script import answer_limit, calls_for
from hubpool_sim.text import (
    continuation,
    count_or_none,
    count_tokens,
    embedding,
    embedding_inputs,
    messages_prompt,
    plain_prompt,
)
from hubpool_sim.tools import ToolCall, chat_ends_in_tool_result


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _complete(request, chat=True)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _complete(request, chat=False)


async def _complete(request: web.Request, *, chat: bool) -> web.StreamResponse:
    engine = engine_of(request)
    body = call_of(request).body
    model = engine.config.find_model(body.get("model"))
    if model is None:
        return unknown_model(request, body.get("model"))
    if model.embedding:
        return error_reply(request, 400, f'"{model.id}" does not support {"chat" if chat else "completions"}')
    if chat:
        if not isinstance(body.get("messages"), list):
            message = verdict_message("missing-messages", engine.flavor.name, window=model.window, prompt_tokens=0)
            return error_reply(request, 400, message)
        prompt = messages_prompt(body["messages"])
        continued, seed = continuation([(m.get("role"), m.get("content")) for m in body["messages"]
                                        if isinstance(m, dict)])
    else:
        prompt = plain_prompt(body.get("prompt"))
        continued, seed = "", prompt
    max_tokens = count_or_none(body.get("max_completion_tokens", body.get("max_tokens")))
    refusal = context_overflow(engine.flavor, count_tokens(prompt), max_tokens or 0, model.window)
    if refusal:
        return json_reply(*refusal)

    gen = Generation(model, prompt, engine.config.tokens, answer_limit(engine.config, max_tokens),
                     call_of(request).fault, continued=continued, seed=seed, prose=engine.config.text == "prose")
    ids = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model.id,
    }
    calls = calls_for(engine.config, body.get("tools"), body.get("messages"),
                      chat_ends_in_tool_result(body.get("messages"))) if chat and gen.kind != "unused" else []
    async with engine.serving(gen):
        if body.get("stream") is True:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            if calls:
                return await _stream_calls(request, engine, gen, ids, calls, include_usage=include_usage)
            return await _stream(request, engine, gen, ids, chat=chat, include_usage=include_usage)
        text = "".join([token async for token in engine.decode(gen)])
    answer = {**ids, "object": "chat.completion" if chat else "text_completion"}
    answer["choices"] = [_choice(chat, text, gen.finish_reason, delta=False)]
    if calls:
        finish = "tool_calls" if gen.finish_reason else None
        answer["choices"] = [{"index": 0, "logprobs": None, "finish_reason": finish, "message": {
            "role": "assistant", "content": None,
            "tool_calls": [{"id": f"call_{c.call_id}", "type": "function",
                            "function": {"name": c.name, "arguments": c.json}} for c in calls]}}]
    answer["usage"] = _usage(engine, gen)
    if engine.flavor.name == "llamacpp" and engine.config.timings:
        answer["timings"] = _timings(gen)
    return await finish_json(request, answer, dropped=gen.kind == "drop")


async def _stream(
    request: web.Request, engine: Engine, gen: Generation, ids: dict[str, Any], *, chat: bool, include_usage: bool
) -> web.StreamResponse:
    response = await open_stream(request, "text/event-stream")
    if chat and gen.kind == "mute":  # what llama-server sends at once: the role, no content
        await response.write(sse({**ids, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                      "logprobs": None, "finish_reason": None}]}))
    index = 0
    async for token in engine.decode(gen):
        choice = _choice(chat, token, None, delta=True)
        if chat and index == 0:
            choice["delta"] = {"role": "assistant", "content": token}
        await response.write(sse({**ids, "choices": [choice]}))
        index += 1
    if gen.kind == "cut":  # ends cleanly, chunked terminator and all, but without its last frame
        await response.write_eof()
        return response
    if gen.kind == "drop":
        await drop_connection(request)
    final = {**ids, "choices": [_choice(chat, "", gen.finish_reason, delta=True, empty_delta=True)]}
    if engine.flavor.name == "llamacpp" and engine.config.timings:
        final["timings"] = _timings(gen)
    await response.write(sse(final))
    if include_usage:
        await response.write(sse({**ids, "choices": [], "usage": _usage(engine, gen)}))
    await response.write(sse("[DONE]"))
    await response.write_eof()
    return response


async def _stream_calls(request: web.Request, engine: Engine, gen: Generation, ids: dict[str, Any],
                        calls: list[ToolCall], *, include_usage: bool) -> web.StreamResponse:
    """Tool calls streamed as engines stream them: a call's id and name first, then its
    arguments in pieces, then a final chunk with finish_reason "tool_calls". A "stall"
    goes silent inside the first call's arguments."""
    response = await open_stream(request, "text/event-stream")
    # the generation's time, paid as usual
    _ = [token async for token in engine.decode(gen, stall=False)]
    stall_at = 1 + calls[0].pieces_before_stall() if gen.kind == "stall" else None
    chunks = []
    for index, call in enumerate(calls):
        chunks.append({"index": index, "id": f"call_{call.call_id}", "type": "function",
                       "function": {"name": call.name, "arguments": ""}})
        chunks += [{"index": index, "function": {"arguments": piece}} for piece in call.pieces()]
    if gen.kind in ("cut", "drop"):
        chunks = chunks[: max(1, len(chunks) // 2)]
    for i, chunk in enumerate(chunks):
        if i == stall_at:
            await silence()
        delta: dict[str, Any] = {"tool_calls": [chunk]}
        if i == 0:
            delta = {"role": "assistant", "content": None, **delta}
        await response.write(sse({**ids, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                      "finish_reason": None}]}))
    if gen.kind == "cut":
        await response.write_eof()
        return response
    if gen.kind == "drop":
        await drop_connection(request)
    await response.write(sse({**ids, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                                  "finish_reason": "tool_calls"}]}))
    if include_usage:
        await response.write(sse({**ids, "choices": [], "usage": _usage(engine, gen)}))
    await response.write(sse("[DONE]"))
    await response.write_eof()
    return response


def _choice(chat: bool, text: str, finish: str | None, *, delta: bool, empty_delta: bool = False) -> dict[str, Any]:
    if not chat:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    if delta:
        return {"index": 0, "delta": {} if empty_delta else {"content": text}, "logprobs": None,
                "finish_reason": finish}
    return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": finish}


def _usage(engine: Engine, gen: Generation) -> dict[str, Any]:
    flavor = engine.flavor.name
    prompt = gen.evaluated_tokens if flavor == "ollama" else gen.prompt_tokens
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": gen.emitted_tokens,
        "total_tokens": prompt + gen.emitted_tokens,
    }
    if flavor == "llamacpp" or (flavor == "vllm" and gen.cached_tokens):
        usage["prompt_tokens_details"] = {"cached_tokens": gen.cached_tokens}
    return usage


def _timings(gen: Generation) -> dict[str, Any]:
    """llama-server's timings block, from the time the simulator really spent."""
    prompt_ms = gen.prompt_s * 1000.0
    predicted_ms = gen.decode_s * 1000.0
    return {
        "cache_n": gen.cached_tokens,
        "prompt_n": gen.evaluated_tokens,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_second": round(gen.evaluated_tokens / gen.prompt_s, 3) if gen.prompt_s > 0 else 0.0,
        "predicted_n": gen.emitted_tokens,
        "predicted_ms": round(predicted_ms, 3),
        "predicted_per_second": round(gen.emitted_tokens / gen.decode_s, 3) if gen.decode_s > 0 else 0.0,
    }


async def embeddings(request: web.Request) -> web.StreamResponse:
    engine = engine_of(request)
    body = call_of(request).body
    model = engine.config.find_model(body.get("model"))
    if model is None:
        return unknown_model(request, body.get("model"))
    texts = embedding_inputs(body.get("input"))
    if not texts:
        return error_reply(request, 400, "input is required: a string or a list of strings")
    gen = Generation(model, "\n".join(texts).encode(), 1, fault=call_of(request).fault, cacheable=False)
    async with engine.serving(gen):
        pass
    dim = engine.config.embedding_dim
    prompt_tokens = sum(count_tokens(t) for t in texts)
    answer = {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": embedding(t, model.id, dim)}
                 for i, t in enumerate(texts)],
        "model": model.id,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
    return await finish_json(request, answer, dropped=gen.kind == "drop")


async def models(request: web.Request) -> web.Response:
    engine = engine_of(request)
    created = int(engine.started_at)
    data = []
    for model in engine.config.models:
        entry: dict[str, Any] = {"id": model.id, "object": "model", "created": created,
                                 "owned_by": engine.flavor.owned_by}
        if engine.flavor.name == "vllm":
            entry.update(root=model.id, parent=None, max_model_len=model.window)
        elif engine.flavor.name == "llamacpp":
            entry["meta"] = {"n_ctx_train": model.window, "n_params": model.parameter_count, "size": model.size}
        elif engine.flavor.name == "lemonade":
            entry.update(checkpoint=f"{model.id}-GGUF", recipe="llamacpp")
        data.append(entry)
    return json_reply(200, {"object": "list", "data": data})
