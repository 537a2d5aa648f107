"""Knowing when an upstream request went out on a pooled keep-alive connection, and how it
died. The node's aiohttp session uses :class:`ReuseAwareConnector`; an attempt sets
:data:`SEND_STATE` around its request and reads it back to decide on its one retry. It is
separate because it wraps aiohttp's connection pool, which nothing else in the relay touches.
"""

from __future__ import annotations

import contextvars
import logging
import socket
import weakref
from typing import Any

import aiohttp
from aiohttp.helpers import is_ip_address


class SendState:
    """What the connector tells the relay about one upstream request, and the reverse."""

    __slots__ = ("reused", "fresh")

    def __init__(self, fresh: bool = False) -> None:
        self.reused = False
        self.fresh = fresh


log = logging.getLogger("hubpool.proxy")

#: TCP keepalive on every upstream connection: after this long with nothing heard, the kernel
#: asks the far end every KEEPALIVE_INTERVAL_S, and gives the connection up after
#: KEEPALIVE_PROBES unanswered asks. A live peer's kernel answers however long its engine
#: thinks, so only a peer that vanished (powered off, asleep, moved, partitioned away) is cut:
#: without it a stream already committed to the app waits on it forever, holding that peer's
#: queue slot, because a socket that only receives never times out on its own.
KEEPALIVE_IDLE_S = 10
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_PROBES = 4
#: what that adds up to: a vanished peer's stream ends this long after its last byte
KEEPALIVE_GIVE_UP_S = KEEPALIVE_IDLE_S + KEEPALIVE_INTERVAL_S * KEEPALIVE_PROBES


def keep_alive(sock: Any) -> None:
    """Turn on TCP keepalive with the timings above (where the platform has the options)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        # Linux names the idle option TCP_KEEPIDLE, macOS TCP_KEEPALIVE
        idle = getattr(socket, "TCP_KEEPIDLE", None) or getattr(socket, "TCP_KEEPALIVE", None)
        for option, value in ((idle, KEEPALIVE_IDLE_S), (getattr(socket, "TCP_KEEPINTVL", None), KEEPALIVE_INTERVAL_S),
                              (getattr(socket, "TCP_KEEPCNT", None), KEEPALIVE_PROBES)):
            if option is not None:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
    except OSError as exc:  # a socket type without the options: the stream just has no such bound
        log.debug("TCP keepalive not set on an upstream connection: %s", exc)


#: set by the relay around one upstream request (the request's task copies it, the object is shared)
SEND_STATE: contextvars.ContextVar[SendState | None] = contextvars.ContextVar("hubpool_send", default=None)


class ReuseAwareConnector(aiohttp.TCPConnector):
    """A TCPConnector that tells the relay whether a request went out on a pooled connection,
    and can be told to open a fresh one.

    An engine or peer may close an idle kept-alive connection just as the relay sends on it;
    the request then dies before any byte of an answer. Only on a reused connection is that
    the keep-alive race (a fresh connection that dies that way is a real failure), so the
    relay needs to know which it was, and its one retry must not take another pooled
    connection the same engine may be closing too. aiohttp says neither; the protocols this
    connector handed out are remembered weakly (a closed connection's is collected)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # noqa: D107
        super().__init__(*args, **kwargs)
        self._handed_out: weakref.WeakSet[Any] = weakref.WeakSet()

    async def _get(self, key: Any, traces: Any) -> Any:
        # aiohttp's pool lookup (private, stable since 3.8): skipped for a retry's fresh connection
        state = SEND_STATE.get()
        if state is not None and state.fresh:
            return None
        return await super()._get(key, traces)

    async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:  # noqa: D102
        try:
            conn = await super().connect(req, traces, timeout)
        except BaseException:
            # no new connection (refused, unreachable, or given up on by the header budget): the
            # name may now say another address (a peer that moved), and the resolver's cache
            # would keep dialling the old one for its whole TTL. Resolve afresh next time.
            self.forget_address(req.host, req.port)
            raise
        proto = conn.protocol
        if proto is not None:
            if proto in self._handed_out:
                state = SEND_STATE.get()
                if state is not None:
                    state.reused = True
            else:
                self._handed_out.add(proto)
                sock = proto.transport.get_extra_info("socket") if proto.transport is not None else None
                if sock is not None:
                    keep_alive(sock)
        return conn

    def forget_address(self, host: str | None, port: int | None) -> None:
        """Drop ``host``'s cached resolution (a literal address has none)."""
        if host and port is not None and not is_ip_address(host):
            self.clear_dns_cache(host, port)


def reset_before_answer(exc: BaseException) -> bool:
    """The peer closed or reset the connection before sending any byte of a response."""
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        # with part of a response read, aiohttp carries it as the message: then bytes arrived
        return isinstance(exc.message, str)
    # a reset (ECONNRESET, EPIPE) carries no partial message, so whether bytes had arrived is
    # not known: on a reused connection it is taken as the race, as browsers do
    return isinstance(exc, aiohttp.ClientOSError) and not isinstance(exc, aiohttp.ClientConnectorError)
