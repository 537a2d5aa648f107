"""Writing answers: errors in the flavor's shape, streams, and connections cut on purpose."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from hubpool_sim.engine import Engine
from hubpool_sim.faults import Fault

ENGINE = web.AppKey("hubpool_sim.engine", Engine)


@dataclass
class Call:
    """What the front door learnt about a request, for its handler: the parsed body, the
    fault it drew, and how it ended if it ends early."""

    body: dict[str, Any] = field(default_factory=dict)
    fault: Fault | None = None
    outcome: str = "aborted"


# aiohttp 3.14 asks for typed request keys; older releases take the plain string.
CALL: Any = web.RequestKey("hubpool_sim.call", Call) if hasattr(web, "RequestKey") else "hubpool_sim.call"
#: set once a stream's headers went out: an error after that cannot become a reply
STARTED: Any = web.RequestKey("hubpool_sim.started", bool) if hasattr(web, "RequestKey") else "hubpool_sim.started"


def call_of(request: web.Request) -> Call:
    return request[CALL]


def engine_of(request: web.Request) -> Engine:
    return request.app[ENGINE]


def is_native(request: web.Request) -> bool:
    """Ollama words errors one way on /api/* and another on its /v1 shim."""
    return engine_of(request).flavor.native and request.path.startswith("/api/")


def json_reply(status: int, body: Any) -> web.Response:
    return web.json_response(body, status=status, dumps=_dumps)


def error_reply(request: web.Request, status: int, message: str, *, error_type: str | None = None) -> web.Response:
    body = engine_of(request).flavor.error_body(status, message, native=is_native(request), error_type=error_type)
    return json_reply(status, body)


def unknown_model(request: web.Request, model: Any) -> web.Response:
    return error_reply(request, 404, engine_of(request).flavor.not_found.format(model=model))


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def sse(payload: Any) -> bytes:
    data = payload if isinstance(payload, str) else _dumps(payload)
    return f"data: {data}\n\n".encode()


def ndjson(payload: Any) -> bytes:
    return (_dumps(payload) + "\n").encode()


async def open_stream(request: web.Request, content_type: str) -> web.StreamResponse:
    """Headers go out only now, after queue, load and prefill: time to first byte is real."""
    response = web.StreamResponse(headers={"Content-Type": content_type, "Cache-Control": "no-cache"})
    await response.prepare(request)
    request[STARTED] = True
    return response


async def drop_connection(request: web.Request) -> None:
    """Abort the TCP connection (RST, no chunked terminator): the "drop" fault.

    What was written leaves first, so the client sees a body cut part-way rather than an
    empty one. The lost connection then cancels this handler (handler_cancellation).
    """
    call_of(request).outcome = "dropped"
    transport = request.transport
    if transport is not None:
        for _ in range(100):
            if transport.get_write_buffer_size() == 0:
                break
            await asyncio.sleep(0.005)
        transport.abort()
    await asyncio.sleep(3600)
    raise asyncio.CancelledError


async def send_truncated(request: web.Request, response: web.Response) -> web.StreamResponse:
    """A non-streamed answer whose connection dies half-way through its Content-Length."""
    body = response.body if isinstance(response.body, bytes) else b""
    partial = web.StreamResponse(status=response.status, headers={"Content-Type": response.content_type})
    partial.content_length = len(body)
    await partial.prepare(request)
    await partial.write(body[: max(1, len(body) // 2)])
    await drop_connection(request)
    return partial


async def finish_json(request: web.Request, body: Any, *, dropped: bool) -> web.StreamResponse:
    response = json_reply(200, body)
    return await send_truncated(request, response) if dropped else response
