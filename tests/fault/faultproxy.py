"""A small asyncio TCP fault proxy, modelled on Toxiproxy's toxics, for one hop between nodes.

It listens on loopback and passes bytes to one upstream address. A toxic applies to the
downstream direction (the answer travelling back to the caller), because that is where the
commit point lies: before the response headers have passed, a fault must make the sender
fail over; after, it must end the stream honestly. Toxics:

    latency      every downstream chunk past ``nbytes`` waits ``ms`` before it is written
    reset        after ``nbytes`` downstream bytes, both sockets are reset (SO_LINGER 0: RST)
    close        after ``nbytes`` downstream bytes, both sockets are closed cleanly (FIN)
    blackhole    after ``nbytes`` downstream bytes nothing more passes and nothing is closed (with
                 ``nbytes`` 0 the request is not even passed on): the caller's deadline decides
    slicer       downstream bytes past ``nbytes`` are written one at a time (``ms`` between slices)

``nbytes`` counts from the first byte of the response, headers included, so a threshold below
the header length acts before the commit point and one past it acts after. Arming or clearing
a toxic closes every open connection first (cleanly), so the next request dials a new one and
meets the toxic instead of riding a kept-alive connection claimed earlier.

A toxic is armed for ``count`` connections (None: every one) whose first request bytes contain
``match`` (default ``/local/``: work forwards only, so capability polls on their own connections
keep passing unless a test says otherwise). Everything runs on one event loop in a daemon
thread; every wait is bounded, and ``stop`` ends every connection.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

KINDS = ("latency", "reset", "close", "blackhole", "slicer")
#: the longest a blackholed connection is held open: past any header budget a test uses, short
#: enough that a forgotten one cannot outlive the test
BLACKHOLE_HOLD_S = 60.0


@dataclass
class Toxic:
    """One armed fault; see the module docstring for the kinds."""

    kind: str
    nbytes: int = 0
    ms: float = 0.0
    count: int | None = None
    match: bytes | None = b"/local/"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown toxic {self.kind!r}; one of {KINDS}")


@dataclass
class ConnRecord:
    """What happened to one proxied connection (for assertions and the report)."""

    opened: float
    toxic: str | None = None
    first_line: str = ""
    down_bytes: int = 0
    up_bytes: int = 0
    head: bytes = b""  # the first downstream bytes (the response head), for thresholds
    client_gone: bool = False
    ended: str = ""  # eof | reset | close | blackhole | error
    closed_at: float | None = None
    events: list[str] = field(default_factory=list)


class FaultProxy:
    """``FaultProxy(target_port).start()``; ``url`` is where callers dial instead of the target."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1", host: str = "127.0.0.1", port: int = 0):
        self.target = (target_host, target_port)
        self.host, self.port = host, port
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="faultproxy", daemon=True)
        self.toxics: list[Toxic] = []
        self.records: list[ConnRecord] = []
        self._lock = threading.Lock()
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._ready = threading.Event()

    # -- control (any thread) --------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> FaultProxy:
        self.thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fault proxy did not start")
        return self

    def stop(self) -> None:
        if not self.thread.is_alive():
            return
        fut = asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop)
        try:
            fut.result(10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)

    def arm(self, toxic: Toxic) -> Toxic:
        self._close_all()
        with self._lock:
            self.toxics.append(toxic)
        return toxic

    def clear(self) -> None:
        with self._lock:
            self.toxics.clear()
        self._close_all()

    def _close_all(self) -> None:
        async def close() -> None:
            for w in list(self._writers):
                if not w.is_closing():
                    w.close()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(5)
        time.sleep(0.2)  # the callers' pools see the FIN before they pick a connection again

    def hits(self, kind: str | None = None) -> list[ConnRecord]:
        with self._lock:
            return [r for r in self.records if r.toxic and (kind is None or r.toxic == kind)]

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- the loop ------------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self._server = self.loop.run_until_complete(asyncio.start_server(self._handle, self.host, self.port))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self.loop.run_forever()
        self.loop.close()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            _abort(w)
        await asyncio.sleep(0)

    def _claim(self, first: bytes) -> Toxic | None:
        with self._lock:
            for t in self.toxics:
                if t.match is not None and t.match not in first:
                    continue
                if t.count is not None:
                    if t.count <= 0:
                        continue
                    t.count -= 1
                return t
        return None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        rec = ConnRecord(opened=time.monotonic())
        with self._lock:
            self.records.append(rec)
        self._writers.add(writer)
        up_writer = None
        try:
            try:
                first = await asyncio.wait_for(reader.read(65536), 30)
            except asyncio.TimeoutError:
                first = b""
            if not first:
                rec.ended = "eof"
                return
            rec.first_line = first.split(b"\r\n", 1)[0].decode("latin-1")[:200]
            toxic = self._claim(first)
            rec.toxic = toxic.kind if toxic else None
            if toxic is not None and toxic.kind == "blackhole" and toxic.nbytes == 0:
                rec.ended = "blackhole"
                await self._swallow(reader)
                return
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*self.target), 10)
            self._writers.add(up_writer)
            up_writer.write(first)
            rec.up_bytes += len(first)
            await asyncio.gather(self._pump_up(reader, up_writer, rec),
                                 self._pump_down(up_reader, writer, up_writer, toxic, rec))
        except (OSError, asyncio.TimeoutError, ConnectionError) as exc:
            rec.ended = rec.ended or "error"
            rec.events.append(type(exc).__name__)
        finally:
            rec.closed_at = time.monotonic()
            for w in (writer, up_writer):
                if w is not None:
                    self._writers.discard(w)
                    if not w.is_closing():
                        w.close()

    async def _swallow(self, reader: asyncio.StreamReader) -> None:
        deadline = time.monotonic() + BLACKHOLE_HOLD_S
        while time.monotonic() < deadline:
            try:
                chunk = await asyncio.wait_for(reader.read(65536), deadline - time.monotonic())
            except asyncio.TimeoutError:
                return
            if not chunk:
                return

    async def _pump_up(self, reader: asyncio.StreamReader, up: asyncio.StreamWriter, rec: ConnRecord) -> None:
        try:
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                rec.up_bytes += len(chunk)
                up.write(chunk)
                await up.drain()
        except (OSError, ConnectionError):
            pass
        finally:
            rec.client_gone = True
            # the caller went away: the far side must see it at once (a client hang-up travels)
            if not up.is_closing():
                up.close()

    async def _pump_down(self, up_reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         up_writer: asyncio.StreamWriter, toxic: Toxic | None, rec: ConnRecord) -> None:
        try:
            while True:
                chunk = await up_reader.read(65536)
                if not chunk:
                    rec.ended = rec.ended or "eof"
                    break
                if len(rec.head) < 4096:
                    rec.head += chunk[:4096 - len(rec.head)]
                if toxic is not None and toxic.kind == "blackhole":
                    room = toxic.nbytes - rec.down_bytes
                    if len(chunk) >= room:
                        writer.write(chunk[:max(room, 0)])
                        rec.down_bytes += max(room, 0)
                        await writer.drain()
                        rec.ended = "blackhole"
                        await self._swallow(up_reader)
                        # hold the caller's side open, silent, until it gives up (bounded)
                        deadline = time.monotonic() + BLACKHOLE_HOLD_S
                        while not rec.client_gone and time.monotonic() < deadline:
                            await asyncio.sleep(0.05)
                        return
                if toxic is not None and toxic.kind in ("reset", "close"):
                    room = toxic.nbytes - rec.down_bytes
                    if len(chunk) >= room:
                        if room > 0:
                            writer.write(chunk[:room])
                            rec.down_bytes += room
                            await writer.drain()
                        rec.ended = toxic.kind
                        if toxic.kind == "reset":
                            _abort(writer)
                            _abort(up_writer)
                        else:
                            writer.close()
                            up_writer.close()
                        return
                active = toxic is not None and rec.down_bytes + len(chunk) > toxic.nbytes
                if active and toxic.kind == "latency":
                    await asyncio.sleep(toxic.ms / 1000)
                if active and toxic.kind == "slicer":
                    for i in range(len(chunk)):
                        writer.write(chunk[i:i + 1])
                        await writer.drain()
                        if toxic.ms:
                            await asyncio.sleep(toxic.ms / 1000)
                else:
                    writer.write(chunk)
                    await writer.drain()
                rec.down_bytes += len(chunk)
        except (OSError, ConnectionError):
            rec.ended = rec.ended or "error"
        finally:
            if not writer.is_closing():
                writer.close()


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with SO_LINGER 0, so the kernel answers with RST instead of FIN."""
    sock = writer.get_extra_info("socket")
    try:
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    writer.transport.abort()
