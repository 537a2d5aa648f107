"""A background loop that runs one step every interval and survives a failing step."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("hubpool.periodic")


class Periodic:
    def __init__(self, name: str, step: Callable[[], Awaitable[object]], interval: Callable[[], float]):
        self.name, self.step, self.interval = name, step, interval
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - stopping: nothing to report
                pass

    async def _run(self) -> None:
        while True:
            try:
                await self.step()
            except Exception:  # noqa: BLE001 - one bad step must not end the loop
                log.exception("%s failed", self.name)
            await asyncio.sleep(self.interval())
