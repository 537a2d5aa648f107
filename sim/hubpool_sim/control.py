"""/_sim/*: how a test that only holds the URL observes and steers the simulator.

    GET    /_sim/stats    the counters (same dict as SimServer.stats())
    GET    /_sim/faults   the armed faults
    POST   /_sim/faults   {"fault": "drop", "model": "qwen3:8b", "count": 1, "path": null}
    DELETE /_sim/faults   disarm every fault
    POST   /_sim/reset    zero the counters and disarm every fault
    GET    /_sim/config   the running configuration
    POST   /_sim/config   {"slots": 1, "decode_tps": 20, ...}  change speed and capacity knobs
    POST   /_sim/flush    empty every prompt cache; only preloaded models stay resident
    POST   /_sim/estimate a chat or completion body -> {"firstTokenMs": ...} if sent now
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from hubpool_sim.estimate import first_token_ms
from hubpool_sim.faults import coerce_fault
from hubpool_sim.replies import engine_of
from hubpool_sim.text import body_prompt


def _reply(body: Any, status: int = 200) -> web.Response:
    return web.json_response(body, status=status)


async def _body(request: web.Request) -> Any:
    try:
        return await request.json()
    except json.JSONDecodeError as exc:
        raise web.HTTPBadRequest(text=json.dumps({"error": f"body is not JSON: {exc}"}),
                                 content_type="application/json") from exc


async def stats(request: web.Request) -> web.Response:
    return _reply(engine_of(request).snapshot())


async def list_faults(request: web.Request) -> web.Response:
    return _reply({"faults": engine_of(request).faults.active()})


async def add_fault(request: web.Request) -> web.Response:
    try:
        fault = engine_of(request).faults.add(coerce_fault(await _body(request)))
    except (TypeError, ValueError) as exc:
        return _reply({"error": str(exc)}, 400)
    return _reply({"added": fault.to_dict(), "faults": engine_of(request).faults.active()})


async def clear_faults(request: web.Request) -> web.Response:
    engine_of(request).faults.clear()
    return _reply({"faults": []})


async def reset(request: web.Request) -> web.Response:
    engine_of(request).reset()
    return _reply(engine_of(request).snapshot())


async def get_config(request: web.Request) -> web.Response:
    return _reply(engine_of(request).config.to_dict())


async def set_config(request: web.Request) -> web.Response:
    changes = await _body(request)
    if not isinstance(changes, dict):
        return _reply({"error": "send a JSON object of fields to change"}, 400)
    try:
        engine_of(request).configure(changes)
    except (TypeError, ValueError) as exc:
        return _reply({"error": str(exc)}, 400)
    return _reply(engine_of(request).config.to_dict())


async def flush(request: web.Request) -> web.Response:
    engine_of(request).flush()
    return _reply(engine_of(request).snapshot())


async def estimate(request: web.Request) -> web.Response:
    body = await _body(request)
    engine = engine_of(request)
    model = engine.config.find_model(body.get("model") if isinstance(body, dict) else None)
    if model is None:
        return _reply({"error": "name one of the engine's models"}, 404)
    return _reply({"firstTokenMs": round(first_token_ms(engine, model, body_prompt(body)), 3)})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/_sim/flush", flush)
    app.router.add_post("/_sim/estimate", estimate)
    app.router.add_get("/_sim/stats", stats)
    app.router.add_get("/_sim/faults", list_faults)
    app.router.add_post("/_sim/faults", add_fault)
    app.router.add_delete("/_sim/faults", clear_faults)
    app.router.add_post("/_sim/reset", reset)
    app.router.add_get("/_sim/config", get_config)
    app.router.add_post("/_sim/config", set_config)
