"""Each engine's own health and status routes: what hubpool's engine plugins probe."""

from __future__ import annotations

from aiohttp import web

from hubpool_sim.replies import engine_of, json_reply

_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


async def vllm_health(request: web.Request) -> web.Response:
    return web.Response(status=200)  # vLLM answers 200 with an empty body


async def vllm_metrics(request: web.Request) -> web.Response:
    """The two gauges an engine-reported queue depth would read (spec: Ranking)."""
    engine = engine_of(request)
    running, waiting = engine.pool.models_in_flight(), engine.pool.models_queued()
    lines = []
    for name, help_text, counts in (
        ("vllm:num_requests_running", "Number of requests in model execution batches.", running),
        ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting),
    ):
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        lines += [f'{name}{{engine="0",model_name="{m.id}"}} {float(counts.get(m.id, 0))}'
                  for m in engine.config.models]
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")


async def llamacpp_health(request: web.Request) -> web.Response:
    return json_reply(200, {"status": "ok"})


async def llamacpp_props(request: web.Request) -> web.Response:
    engine = engine_of(request)
    model = engine.config.models[0]  # llama-server serves one model
    return json_reply(200, {
        "default_generation_settings": {"n_ctx": model.window},
        "total_slots": engine.pool.size,
        "model_path": f"/models/{model.id}",
        "chat_template": _CHAT_TEMPLATE,
    })


async def llamacpp_slots(request: web.Request) -> web.Response:
    engine = engine_of(request)
    window = engine.config.models[0].window
    slots = sorted((s for s in engine.pool.slots if s.id < engine.pool.size), key=lambda s: s.id)
    return json_reply(200, [{"id": s.id, "n_ctx": window, "is_processing": s.busy} for s in slots])


async def vllm_is_sleeping(request: web.Request) -> web.Response:
    """vLLM's sleep mode state; 404 unless the engine was configured with one (as vLLM serves
    the route only with --enable-sleep-mode)."""
    sleeping = engine_of(request).config.sleeping
    if sleeping is None:
        return json_reply(404, {"detail": "Not Found"})
    return json_reply(200, {"is_sleeping": sleeping})


async def llamacpp_models(request: web.Request) -> web.Response:
    """llama-server's router mode: every model with its load status; 404 outside router mode."""
    engine = engine_of(request)
    if not engine.config.router:
        return json_reply(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})
    resident = {m.id for m, _ in engine.resident_models()}
    return json_reply(200, {"data": [{"id": m.id, "object": "model", "owned_by": "llamacpp",
                                      "status": {"value": "loaded" if m.id in resident else "unloaded"}}
                                     for m in engine.config.models]})


async def lemonade_health(request: web.Request) -> web.Response:
    engine = engine_of(request)
    loaded = engine.resident_models()
    return json_reply(200, {
        "status": "ok",
        "checkpoint_loaded": f"{engine.last_model}-GGUF" if engine.last_model else None,
        "model_loaded": engine.last_model,
        "all_models_loaded": [
            {
                "model_name": m.id,
                "checkpoint": f"{m.id}-GGUF",
                "device": "gpu",
                "type": "embedding" if m.embedding else "llm",
                "recipe": "llamacpp",
                "recipe_options": {"ctx_size": m.window},
            }
            for m, _ in loaded
        ],
    })


async def omlx_health(request: web.Request) -> web.Response:
    return json_reply(200, {"status": "healthy"})
