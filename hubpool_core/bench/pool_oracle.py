"""``hubpool bench pool``'s oracle: a bound, never a strategy.

It knows what no real dispatcher can: it asks every simulated engine when a request sent
now would get its first token there (``POST /_sim/estimate``, which plays the engine's own
slots, queue, prompt cache and residency forward) and sends the request to the earliest.
Its figures say how close a dispatcher comes to the best any placement could do.

Run: ``python -m hubpool_core.bench.pool_oracle --port P --upstream URL [--upstream URL ...]``.
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
from aiohttp import web

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "date", "server"}


def build_app(upstreams: list[str]) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    state: dict[str, aiohttp.ClientSession] = {}

    async def start(_app: web.Application) -> None:
        state["http"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False,
                                              timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))

    async def stop(_app: web.Application) -> None:
        await state["http"].close()

    async def estimate(url: str, raw: bytes) -> float:
        try:
            async with state["http"].post(url + "/_sim/estimate", data=raw,
                                          headers={"Content-Type": "application/json"}) as r:
                return float((await r.json())["firstTokenMs"]) if r.status == 200 else float("inf")
        except (aiohttp.ClientError, ValueError, KeyError):
            return float("inf")

    async def forward(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        guesses = await asyncio.gather(*(estimate(u, raw) for u in upstreams))
        best = upstreams[min(range(len(upstreams)), key=lambda i: guesses[i])]
        async with state["http"].post(best + request.path, data=raw,
                                      headers={"Content-Type": "application/json"}) as upstream:
            response = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP})
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": []})

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_post("/v1/chat/completions", forward)
    app.router.add_get("/v1/models", models)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(prog="pool_oracle")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", action="append", required=True)
    args = parser.parse_args()
    web.run_app(build_app(args.upstream), host="127.0.0.1", port=args.port, access_log=None, print=None,
                handler_cancellation=True)


if __name__ == "__main__":
    main()
