"""The app's side of one relayed request: watching its connection for a hang-up, and awaiting
upstream work in a way a hang-up can stop. A client that hangs up before headers aborts the
upstream request too (the engine learns to stop when its socket closes), and one that hangs
up mid-stream wakes the pump's read. It is separate because every part that waits on the
upstream (the attempt, the verdict read, the output judge, the pump) waits through it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import aiohttp
from starlette.types import Receive

T = TypeVar("T")


class ClientGone(Exception):
    """The app closed its connection."""


class Hangup:
    """One request's watch on the app's connection: ``watch`` reads it in its own task,
    ``until`` awaits upstream work in the walking task unless the app hangs up first."""

    __slots__ = ("gone", "live", "task", "waiting", "hung_up")

    def __init__(self, task: asyncio.Task[Any] | None) -> None:
        self.gone = asyncio.Event()
        #: the upstream answer being pumped: a hang-up closes it, which wakes the pump's read
        #: (racing every chunk's read against the hang-up cost two tasks per chunk)
        self.live: aiohttp.ClientResponse | None = None
        #: the task walking the candidates, and whether it is inside until (a hang-up then
        #: cancels it there) and was cancelled by the hang-up (rather than by the server)
        self.task = task
        self.waiting = False
        self.hung_up = False

    async def watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.gone.set()
                if self.live is not None:
                    self.live.close()
                if self.waiting and not self.hung_up and self.task is not None:
                    self.hung_up = True
                    self.task.cancel()
                return

    async def until(self, awaitable: Awaitable[T], timeout: float | None) -> T:
        """Await ``awaitable`` in this task unless the app hangs up first (ClientGone: the
        watcher cancels the wait, which closes the upstream socket, which is how the engine
        learns to stop) or ``timeout`` seconds pass (TimeoutError).

        Awaited in place: racing it against the hang-up in two new tasks per wait cost more
        than the rest of a non-streamed request's own work (docs/performance.md, step 6)."""
        if self.gone.is_set():
            if asyncio.iscoroutine(awaitable):
                awaitable.close()
            raise ClientGone()
        self.waiting = True
        try:
            if timeout is None:
                return await awaitable
            async with asyncio.timeout(timeout):
                return await awaitable
        except asyncio.CancelledError:
            if not self.hung_up:
                raise  # the server is stopping this request: not ours to swallow
            self.hung_up = False
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            raise ClientGone() from None
        finally:
            self.waiting = False


def settle_hangup(node: Any, plan: Any, cand: Any, started: float,
                  upstream: aiohttp.ClientResponse | None = None) -> None:
    """The spec's hang-up row for an app that left before anything was relayed: failed, no
    status, ``clientClosed``, the node it was waiting on, and how long it waited. ``upstream``:
    the engine had sent its headers (the walk was reading a 500's verdict or a body to judge);
    its connection is closed, not released, so the engine stops too."""
    if upstream is not None:
        upstream.close()
    waited = int((time.monotonic() - started) * 1000)
    answered = "" if upstream is None else f" (its HTTP {upstream.status} was still being read)"
    node.routing_log.touch(plan.row, outcome="failed", status=None, clientClosed=True, durationMs=waited,
                           reason=f"the app closed its connection after {waited} ms; {cand.node} had not "
                                  f"answered yet{answered}")
