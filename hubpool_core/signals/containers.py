"""Container counts: sampled off the poll path by whatever plugin registers a source, and
validated wholesale on the read path (spec: Container counts; absent means not reported)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from hubpool_core.periodic import Periodic

log = logging.getLogger("hubpool.containers")

SAMPLE_INTERVAL_S = 60.0
FIELDS = ("running", "stopped", "total", "cpuPercent", "memoryBytes")
MAX_CONTAINERS = 100_000
MAX_MEMORY = 2**60


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_CONTAINERS


def clamp_containers(value: Any) -> dict[str, Any] | None:
    """The rollup if every field is sane, else None: one bad field rejects it, never 0."""
    if not isinstance(value, dict) or set(FIELDS) - set(value):
        return None
    running, stopped, total = value["running"], value["stopped"], value["total"]
    cpu, memory = value["cpuPercent"], value["memoryBytes"]
    if not (_count(running) and _count(stopped) and _count(total)):
        return None
    if running + stopped != total:
        return None  # self-contradictory (more running than exist, or not summing)
    if not isinstance(cpu, (int, float)) or isinstance(cpu, bool) or not math.isfinite(cpu) or not 0 <= cpu <= 100_000:
        return None
    if not isinstance(memory, (int, float)) or isinstance(memory, bool) or not math.isfinite(memory) \
            or not 0 <= memory <= MAX_MEMORY:
        return None
    return {"running": running, "stopped": stopped, "total": total, "cpuPercent": float(cpu),
            "memoryBytes": int(memory)}


class ContainerSampler:
    def __init__(self, sources: list[Callable[[], Any]]):
        self.sources = sources
        self.sample: dict[str, Any] | None = None
        self.sampled_at: float | None = None
        self._loop = Periodic("container sample", self.sample_once, lambda: SAMPLE_INTERVAL_S)

    def start(self) -> None:
        if self.sources:
            self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def sample_once(self) -> None:
        for source in self.sources:
            try:
                value = clamp_containers(await asyncio.to_thread(source))
            except Exception as exc:  # noqa: BLE001
                log.debug("container-stats source failed: %s", exc)
                value = None
            if value is not None:
                self.sample, self.sampled_at = value, time.monotonic()
                return

    def current(self) -> dict[str, Any] | None:
        """The last sample, or None when it is older than two intervals."""
        if self.sample is None or self.sampled_at is None:
            return None
        if time.monotonic() - self.sampled_at > 2 * SAMPLE_INTERVAL_S:
            return None
        return self.sample
