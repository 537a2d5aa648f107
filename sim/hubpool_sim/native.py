"""Ollama's native dialect: /api/chat, /api/generate, /api/embed, /api/embeddings, /api/show,
/api/tags, /api/ps, /api/version and ``GET /``.

As in Ollama: chat and generate stream NDJSON unless the body says ``"stream": false``;
``options.num_predict`` caps the answer and ``options.num_ctx`` sets the window, past which a
prompt is truncated rather than refused; a body without messages (or prompt) only loads the
model, and with ``keep_alive: 0`` unloads it; durations are nanoseconds; ``prompt_eval_count``
counts only the tokens evaluated, not those served from the prompt cache.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from hubpool_sim.config import SimModel
from hubpool_sim.engine import Engine, Generation
from hubpool_sim.replies import (
    call_of,
    drop_connection,
    engine_of,
    error_reply,
    finish_json,
    json_reply,
    ndjson,
    open_stream,
    unknown_model,
)
from hubpool_sim.text import (
    continuation,
    count_or_none,
    count_tokens,
    embedding,
    embedding_inputs,
    messages_prompt,
    plain_prompt,
    rfc3339,
)

_NS = 1_000_000_000


async def root(request: web.Request) -> web.Response:
    return web.Response(text="Ollama is running")


async def version(request: web.Request) -> web.Response:
    return json_reply(200, {"version": engine_of(request).config.version})


async def chat(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def generate(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


def _piece(chat: bool, text: str) -> dict[str, Any]:
    return {"message": {"role": "assistant", "content": text}} if chat else {"response": text}


async def _generate(request: web.Request, *, chat: bool) -> web.StreamResponse:
    engine = engine_of(request)
    body = call_of(request).body
    model = engine.config.find_model(body.get("model"))
    if model is None:
        return unknown_model(request, body.get("model"))
    if model.embedding:
        return error_reply(request, 400, f'"{model.id}" does not support {"chat" if chat else "generate"}')
    options = body.get("options") if isinstance(body.get("options"), dict) else {}
    num_predict = count_or_none(options.get("num_predict", body.get("num_predict")))
    context = count_or_none(options.get("num_ctx")) or model.window
    unload_after = body.get("keep_alive") in (0, "0", "0s")
    if chat:
        prompt, empty = messages_prompt(body.get("messages")), not body.get("messages")
        turns = body.get("messages") if isinstance(body.get("messages"), list) else []
        continued, seed = continuation([(m.get("role"), m.get("content")) for m in turns if isinstance(m, dict)])
    else:
        prompt, empty = plain_prompt(body.get("prompt"), body.get("system")), not body.get("prompt")
        continued, seed = "", plain_prompt(body.get("prompt"))
    if empty:
        return _load_or_unload(engine, model, chat, context, unload_after)

    gen = Generation(model, prompt, engine.config.tokens, num_predict, call_of(request).fault, context=context,
                     continued=continued, seed=seed, prose=engine.config.text == "prose")
    try:
        async with engine.serving(gen):
            if body.get("stream") is not False:
                return await _stream(request, engine, gen, chat)
            text = "".join([token async for token in engine.decode(gen)])
    finally:
        if unload_after:
            engine.unload(model.id)
    if gen.kind == "cut":  # a non-streamed answer that never finished: done stays false
        answer = {"model": model.id, "created_at": rfc3339(), **_piece(chat, text), "done": False}
    else:
        answer = _final(engine, gen, chat, text)
    return await finish_json(request, answer, dropped=gen.kind == "drop")


def _load_or_unload(engine: Engine, model: SimModel, chat: bool, context: int, unload: bool) -> web.Response:
    if unload:
        engine.unload(model.id)
    else:
        engine.mark_resident(model, context)
    return json_reply(200, {
        "model": model.id,
        "created_at": rfc3339(),
        **_piece(chat, ""),
        "done_reason": "unload" if unload else "load",
        "done": True,
    })


async def _stream(request: web.Request, engine: Engine, gen: Generation, chat: bool) -> web.StreamResponse:
    response = await open_stream(request, "application/x-ndjson")
    async for token in engine.decode(gen):
        line = {"model": gen.model.id, "created_at": rfc3339(), **_piece(chat, token), "done": False}
        await response.write(ndjson(line))
    if gen.kind == "cut":  # ends cleanly but without the {"done": true} line
        await response.write_eof()
        return response
    if gen.kind == "drop":
        await drop_connection(request)
    await response.write(ndjson(_final(engine, gen, chat, "")))
    await response.write_eof()
    return response


def _final(engine: Engine, gen: Generation, chat: bool, text: str) -> dict[str, Any]:
    return {
        "model": gen.model.id,
        "created_at": rfc3339(),
        **_piece(chat, text),
        "done": True,
        "done_reason": gen.finish_reason,
        "total_duration": int(gen.total_s() * _NS),
        "load_duration": int(gen.load_s * _NS),
        "prompt_eval_count": gen.evaluated_tokens,
        "prompt_eval_duration": int(gen.prompt_s * _NS),
        "eval_count": gen.emitted_tokens,
        "eval_duration": int(gen.decode_s * _NS),
    }


async def embed(request: web.Request) -> web.StreamResponse:
    return await _embed(request, legacy=False)


async def embeddings(request: web.Request) -> web.StreamResponse:
    return await _embed(request, legacy=True)


async def _embed(request: web.Request, *, legacy: bool) -> web.StreamResponse:
    """/api/embed takes ``input`` (str or list); the older /api/embeddings one ``prompt``."""
    engine = engine_of(request)
    body = call_of(request).body
    model = engine.config.find_model(body.get("model"))
    if model is None:
        return unknown_model(request, body.get("model"))
    texts = embedding_inputs(body.get("prompt") if legacy else body.get("input"))
    gen = Generation(model, "\n".join(texts).encode(), 1, fault=call_of(request).fault, cacheable=False)
    async with engine.serving(gen):
        pass
    dim = engine.config.embedding_dim
    vectors = [embedding(t, model.id, dim) for t in texts]
    if legacy:
        answer: dict[str, Any] = {"embedding": vectors[0] if vectors else []}
    else:
        answer = {
            "model": model.id,
            "embeddings": vectors,
            "total_duration": int(gen.total_s() * _NS),
            "load_duration": int(gen.load_s * _NS),
            "prompt_eval_count": sum(count_tokens(t) for t in texts),
        }
    return await finish_json(request, answer, dropped=gen.kind == "drop")


def _details(model: SimModel) -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": "gguf",
        "family": model.family,
        "families": [model.family],
        "parameter_size": model.parameter_size,
        "quantization_level": model.quantization,
    }


async def tags(request: web.Request) -> web.Response:
    engine = engine_of(request)
    modified = rfc3339(engine.started_at)
    return json_reply(200, {"models": [
        {
            "name": m.id,
            "model": m.id,
            "modified_at": modified,
            "size": m.size,
            "digest": m.digest,
            "details": _details(m),
        }
        for m in engine.config.models
    ]})


async def ps(request: web.Request) -> web.Response:
    """Models resident now: served a request (or preloaded) within keep_alive."""
    engine = engine_of(request)
    return json_reply(200, {"models": [
        {
            "name": m.id,
            "model": m.id,
            "size": m.size,
            "digest": m.digest,
            "details": _details(m),
            "expires_at": rfc3339(residency.expires_at),
            "size_vram": m.size,
            "context_length": residency.context_length,
        }
        for m, residency in engine.resident_models()
    ]})


async def show(request: web.Request) -> web.Response:
    engine = engine_of(request)
    body = call_of(request).body
    name = body.get("model") or body.get("name")
    model = engine.config.find_model(name)
    if model is None:
        return error_reply(request, 404, f"model '{name}' not found")
    return json_reply(200, {
        "modelfile": f'# Modelfile generated by "ollama show"\nFROM /models/{model.id}\n',
        "parameters": 'stop "<|eot_id|>"\ntemperature 0.7',
        "template": "{{ range .Messages }}{{ .Role }}: {{ .Content }}\n{{ end }}assistant: ",
        "details": _details(model),
        "model_info": {
            "general.architecture": "llama",
            "general.parameter_count": model.parameter_count,
            "llama.context_length": model.window,
        },
        "capabilities": ["embedding"] if model.embedding else ["completion", "tools"],
        "modified_at": rfc3339(engine.started_at),
    })
