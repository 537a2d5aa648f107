"""The ASGI application of one node."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from hubpool_core import __version__
from hubpool_core.api import advice, inference, local, metrics_route, operator, peers
from hubpool_core.node.node import Node
from hubpool_core.proxy import LOCAL_PREFIX
from hubpool_core.store import storage_refusal
from hubpool_core.store.db import UNREACHABLE as DB_UNREACHABLE
from hubpool_core.web import mount as mount_web_ui


#: the answer to an unhandled error: never a stack trace to the caller; the service log has it
def _crash_body(exc: Exception) -> dict[str, str]:
    return {"error": f"Internal error in hubpool ({type(exc).__name__}); see the node's log"}


#: POST path -> (handler, route key): the app-facing inference routes and a peer's forwards
#: to this node's engines (the second hop), served on the fast path
FAST_POSTS: dict[str, tuple[Any, str]] = {
    **{path: (inference.routed, route) for path, route in inference.FAST_PATHS.items()},
    **{LOCAL_PREFIX + route: (local.forward, route) for route in inference.ROUTED},
}


class NodeApp(FastAPI):
    """FastAPI, with the relay's hot path (:data:`FAST_POSTS`) served as pure ASGI; every
    other route, and every other method on those paths, goes through FastAPI."""

    # ASGI servers pass the scope as a dict (the ASGI spec's type), which the fast path relies
    # on; Starlette declares the wider MutableMapping
    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:  # type: ignore[override]  # noqa: D102
        if scope["type"] == "http" and scope["method"] == "POST":
            fast = FAST_POSTS.get(scope["path"])
            if fast is not None:
                await self._fast(scope, receive, send, *fast)
                return
        await super().__call__(scope, receive, send)

    async def _fast(self, scope: dict, receive: Any, send: Any, handler: Any, route: str) -> None:
        started = False

        async def tracked(message: dict) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await inference.serve_routed(self, scope, receive, tracked, route, handler)
        except Exception as exc:  # noqa: BLE001 - the same answer as the app's crash handler
            logging.getLogger("hubpool").exception("unhandled error")
            if not started:
                await JSONResponse(_crash_body(exc), status_code=500)(scope, receive, send)


def create_app(node: Node) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_app: FastAPI):  # noqa: ANN202
        await node.start()
        try:
            yield
        finally:
            await node.stop()

    app = NodeApp(title="hubpool", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.node = node
    app.include_router(operator.build_router())
    app.include_router(peers.build_router())
    app.include_router(local.build_router())
    app.include_router(advice.build_router())
    app.include_router(inference.build_router())
    app.include_router(metrics_route.build_router(node))
    mount_web_ui(app)  # the landing page at /, sign-in, and the pages under /ui

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": "Invalid request", "detail": exc.errors()}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = {404: "No such route on this node", 405: "Method not allowed on this route"}.get(
            exc.status_code, str(exc.detail))
        return JSONResponse({"error": message}, status_code=exc.status_code)

    async def storage(request: Request, exc: Exception) -> JSONResponse:
        # a full disk (507) or a database another writer held past the busy timeout (503): said
        # as such, never as a crash; the write was refused whole and the node keeps serving
        refused = storage_refusal(exc, node.env.data_dir)
        if refused is not None:
            logging.getLogger("hubpool").warning("a write was refused: %s", refused.message)
            headers = {"Retry-After": "1"} if refused.status == 503 else None
            return JSONResponse({"error": refused.message}, status_code=refused.status, headers=headers)
        if isinstance(exc, DB_UNREACHABLE):
            # a change that needs the store while it cannot be reached: nothing was written (each
            # write is one transaction), the node is told, and the caller may retry
            node.db.mark_down(exc)
            return JSONResponse({"error": "This node's database is unreachable; nothing was changed. Retry once "
                                          "it is back (GET /api/inference/pool/status shows database.available).",
                                 "code": "database_unavailable", "detail": node.db.last_error},
                                status_code=503, headers={"Retry-After": "5"})
        return await crashed(request, exc)

    for kind in (OSError, *DB_UNREACHABLE):
        app.add_exception_handler(kind, storage)

    @app.exception_handler(Exception)
    async def crashed(_request: Request, exc: Exception) -> JSONResponse:
        logging.getLogger("hubpool").exception("unhandled error")
        return JSONResponse(_crash_body(exc), status_code=500)

    return app
