"""A tap on the wire between a client and what it talks to: an HTTP relay on loopback that
keeps each request (method, path, headers, body as sent) and the answer's status and headers,
and passes the answer's bytes on as they come. The capture script records the clients'
requests with it; the pool test reads which node served each request of each session (the
``X-Hub-Pool-*`` answer headers, beside the client's own session header)."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
from aiohttp import web

#: request headers a relay leaves to its own HTTP client
_HOP = {"host", "content-length", "transfer-encoding", "connection"}
_SESSION = web.AppKey("tap_session", aiohttp.ClientSession)


def tap(upstream: str, kept: list[dict[str, Any]]) -> web.Application:
    """An app that relays everything to ``upstream`` and appends one record per request to ``kept``."""

    async def relay(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        record: dict[str, Any] = {"method": request.method, "path": request.path_qs,
                                  "headers": dict(request.headers), "body": raw.decode("utf-8", "replace"),
                                  "started": time.monotonic()}
        kept.append(record)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        session = request.app[_SESSION]
        async with session.request(request.method, upstream + request.path_qs, data=raw, headers=headers) as up:
            record["status"] = up.status
            record["answer_headers"] = {k.lower(): v for k, v in up.headers.items()}
            passed = {k: v for k, v in up.headers.items()
                      if k.lower() in ("content-type", "content-encoding") or k.lower().startswith("x-hub-pool-")}
            response = web.StreamResponse(status=up.status, headers=passed)
            await response.prepare(request)
            async for chunk in up.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            record["ended"] = time.monotonic()
            return response

    async def open_session(app: web.Application) -> None:
        # no timeout of its own: the client's and the node's decide
        app[_SESSION] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False)

    async def close_session(app: web.Application) -> None:
        await app[_SESSION].close()

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.on_startup.append(open_session)
    app.on_cleanup.append(close_session)
    app.router.add_route("*", "/{tail:.*}", relay)
    return app
