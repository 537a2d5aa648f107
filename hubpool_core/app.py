"""The ASGI application of one node."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from hubpool_core import __version__
from hubpool_core.api import advice, inference, local, metrics_route, operator, peers
from hubpool_core.node import Node


def create_app(node: Node) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_app: FastAPI):  # noqa: ANN202
        await node.start()
        try:
            yield
        finally:
            await node.stop()

    app = FastAPI(title="hubpool", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.node = node
    app.include_router(operator.build_router())
    app.include_router(peers.build_router())
    app.include_router(local.build_router())
    app.include_router(advice.build_router())
    app.include_router(inference.build_router())
    app.include_router(metrics_route.build_router(node))

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": "Invalid request", "detail": exc.errors()}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = {404: "No such route on this node", 405: "Method not allowed on this route"}.get(
            exc.status_code, str(exc.detail))
        return JSONResponse({"error": message}, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def crashed(_request: Request, exc: Exception) -> JSONResponse:
        # never a stack trace to the caller; the service log has it
        import logging

        logging.getLogger("hubpool").exception("unhandled error")
        return JSONResponse({"error": f"Internal error in hubpool ({type(exc).__name__}); see the node's log"},
                            status_code=500)

    return app
