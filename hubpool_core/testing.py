"""Testing aids for plugin authors: a fake engine server in a dict, and a runner.

Nothing here runs in a node; it is public so every plugin's tests can share it rather
than each carrying its own ``httpx.MockTransport`` scaffolding::

    from hubpool_core import EngineConfig
    from hubpool_core.testing import mock_http, raising, run

    seen = []
    http = mock_http({"/v1/models": (200, {"object": "list", "data": []})}, seen=seen)
    result = run(MyEngine(EngineConfig(base_url="http://127.0.0.1:9")).probe(http))
    assert result.healthy and seen[0].url.path == "/v1/models"
    assert not run(MyEngine(...).probe(mock_http(raising(httpx.ConnectError)))).running
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NoReturn, TypeVar

import httpx

from hubpool_core.engine import Engine

T = TypeVar("T")

#: What a route answers: an ``httpx.Response`` (copied for each request), a
#: ``(status, body)`` pair (see :func:`answer`), or a function of the request that returns
#: a Response or raises (see :func:`raising`).
Route = httpx.Response | tuple[int, Any] | Callable[[httpx.Request], httpx.Response]


def answer(status: int, body: Any = None) -> httpx.Response:
    """An HTTP answer: a ``str`` body is sent as text (``""`` for an empty body), any
    other value as JSON (``None`` is JSON ``null``)."""
    if isinstance(body, str):
        return httpx.Response(status, text=body)
    if body is None:  # httpx reads json=None as "no body"
        return httpx.Response(status, content=b"null", headers={"content-type": "application/json"})
    return httpx.Response(status, json=body)


def raising(exc_type: type[httpx.RequestError], message: str = "boom") -> Callable[[httpx.Request], NoReturn]:
    """A route (or whole server, passed as ``routes``) that fails the request with
    ``exc_type``: ``httpx.ConnectError`` is nothing listening, ``httpx.ConnectTimeout`` a
    connection not made in time, ``httpx.ReadTimeout`` a server that never answers."""

    def handler(request: httpx.Request) -> NoReturn:
        raise exc_type(message, request=request)

    return handler


def mock_http(
    routes: Mapping[str, Route] | Callable[[httpx.Request], httpx.Response],
    *,
    missing: Route = (404, ""),
    seen: list[httpx.Request] | None = None,
    timeout: float = 2.0,
) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` whose requests never leave the process.

    ``routes`` maps a URL path (no query string; any host, any method) to a
    :data:`Route`, or is a single function answering every request. A path not listed
    gets ``missing`` (by default a 404 with an empty body; pass the engine's own 404 to
    be faithful). Every request is appended to ``seen`` when given, to check paths and
    headers. The client needs no closing.
    """

    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        if callable(routes):
            return routes(request)
        return _respond(routes.get(request.url.path, missing), request)

    return httpx.AsyncClient(transport=httpx.MockTransport(handler), timeout=timeout)


def run(awaitable: Awaitable[T]) -> T:
    """Run one coroutine (``engine.probe(http)``, ``engine.residency(http)``, ...) to its
    result in a fresh event loop, from synchronous test code."""

    async def go() -> T:
        return await awaitable

    return asyncio.run(go())


@functools.cache
def load_installed_engines() -> tuple[type[Engine], ...]:
    """Import every installed plugin the way a node does (once per process) and return
    the engine classes they register. Engines recognise each other by ``owned_by`` only
    among classes defined in the process (:meth:`Engine.other_engine_named`), so a test
    of "this server is another engine" calls this first rather than importing another
    plugin (which its distribution does not depend on)."""
    from hubpool_core.plugins import load_plugins

    return tuple(load_plugins().engines)


def _respond(route: Route, request: httpx.Request) -> httpx.Response:
    if isinstance(route, httpx.Response):
        return httpx.Response(route.status_code, headers=route.headers, content=route.content)
    if isinstance(route, tuple):
        return answer(*route)
    return route(request)
