"""``hubpool bench pool``'s LiteLLM dispatchers: LiteLLM's own ``Router`` with one of its
routing strategies (``least-busy``, ``latency-based-routing``) in front of the simulated
engines, served as an OpenAI chat route. Only run when ``litellm`` is importable (it is not
a dependency: ``uv run --with litellm hubpool bench pool``).

Run: ``python -m hubpool_core.bench.pool_litellm --port P --strategy S --route MODEL=URL ...``.
"""

from __future__ import annotations

import argparse
from typing import Any

from aiohttp import web


def build_app(strategy: str, routes: list[tuple[str, str]]) -> web.Application:
    from litellm import Router  # type: ignore[import-not-found]  # optional: the bench checks first

    models = list(dict.fromkeys(model for model, _ in routes))
    model_list = [{"model_name": model, "litellm_params": {"model": f"openai/{model}", "api_base": url + "/v1",
                                                           "api_key": "sk-bench"}}
                  for model, url in routes]
    router = Router(model_list=model_list, routing_strategy=strategy, num_retries=0)

    async def chat(request: web.Request) -> web.StreamResponse:
        body: dict[str, Any] = await request.json()
        stream = await router.acompletion(model=body["model"], messages=body["messages"], stream=True,
                                          max_tokens=body.get("max_tokens"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        async for chunk in stream:
            await response.write(b"data: " + chunk.model_dump_json().encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def listing(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": m, "object": "model"} for m in models]})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", listing)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(prog="pool_litellm")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--route", action="append", required=True, metavar="MODEL=URL")
    args = parser.parse_args()
    routes = [tuple(r.split("=", 1)) for r in args.route]
    web.run_app(build_app(args.strategy, routes), host="127.0.0.1", port=args.port,
                access_log=None, print=None)


if __name__ == "__main__":
    main()
