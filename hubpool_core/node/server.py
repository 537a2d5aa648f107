"""Running a node under uvicorn (uvloop and httptools, as measured: docs/performance.md)."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from hubpool_core.config import EnvSettings
from hubpool_core.node.app import create_app
from hubpool_core.node.node import Node
from hubpool_core.store.db import DatabaseUrlError, migrate_apart

#: seconds a stopping node lets in-flight streams finish before closing them
GRACEFUL_SHUTDOWN_S = 30
#: seconds an idle keep-alive connection stays open. Longer than aiohttp's client keep-alive
#: (15 s) on purpose: when the server closes first, a peer that reuses the connection at that
#: instant gets a reset (ClientOSError) and the forward fails before it was sent; uvicorn's
#: default is 5 s. Measured: 2 resets in 24 reuses at the server's timeout, none beyond it.
KEEP_ALIVE_S = 75


class HeadWithBody:
    """A connection's transport that sends a response head together with the body that follows.

    uvicorn writes the head (status line and headers) as soon as the app starts the response,
    then each body message: two writes, two wake-ups of the client, for an answer the relay
    already holds whole. Here a head waits for the next write or, at the latest, the end of
    the current event-loop turn, so a held answer leaves in one write while a stream's head
    still goes out at once (it is flushed before the loop next waits for the engine's bytes).
    Order is never changed: anything else is written straight through, after a held head."""

    __slots__ = ("_transport", "_loop", "_held", "_flush")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:  # noqa: D107
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._flush: asyncio.Handle | None = None

    def write(self, data: bytes) -> None:
        """Write, sending a held head first in the same write."""
        held = self._held
        if held is not None:
            self._held = None
            self._flush.cancel()  # type: ignore[union-attr]
            self._transport.write(held + data)
        elif data[:9] == b"HTTP/1.1 " and data[-4:] == b"\r\n\r\n":
            self._held = data
            self._flush = self._loop.call_soon(self._write_held)
        else:
            self._transport.write(data)

    def _write_held(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        """Close after whatever is held has been written."""
        if self._held is not None:
            self._flush.cancel()  # type: ignore[union-attr]
            self._write_held()
        self._transport.close()

    def abort(self) -> None:
        """Drop the connection (and anything held) at once."""
        if self._flush is not None:
            self._flush.cancel()
        self._held = None
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class NodeHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over :class:`HeadWithBody`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # noqa: D102
        super().connection_made(HeadWithBody(transport, self.loop))  # type: ignore[arg-type]


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )


def make_config(env: EnvSettings, node: Node | None = None, log_level: str = "info") -> uvicorn.Config:
    node = node or Node(env)
    host, port = env.host_port
    return uvicorn.Config(
        create_app(node), host=host, port=port, loop="uvloop", http=NodeHttpProtocol,
        log_level=log_level.lower(), access_log=False, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        timeout_keep_alive=KEEP_ALIVE_S,
        lifespan="on",
        # no WebSocket route exists; "auto" would import a websockets implementation (G7)
        ws="none",
        # The guards read forwarded headers themselves (and trust them only under
        # HUB_TRUST_PROXY); uvicorn must not rewrite the client address or scheme first.
        proxy_headers=False,
    )


def run_node(env: EnvSettings, log_level: str = "info") -> None:
    """Run this machine's node until it is stopped (the `hubpool serve` process)."""
    configure_logging(log_level)
    env.data_dir.mkdir(parents=True, exist_ok=True)
    # a schema behind is migrated in a child, so alembic is never resident in the node (G7);
    # the node's own migrate() then finds it current (or, if the child failed, runs it itself)
    migrate_apart(env.resolved_database_url())
    if (history_url := env.resolved_history_url()) is not None and history_url != env.resolved_database_url():
        try:
            migrate_apart(history_url)
        except DatabaseUrlError:
            pass  # the node says so once and runs with history off
    node = Node(env)
    logging.getLogger("hubpool").info("node listening on %s (data in %s)", env.base_url, env.data_dir)
    uvicorn.Server(make_config(env, node, log_level)).run()
