"""The GPU-pressure sampler: one reading every 10 s, off the request path, only while
this node has a connected peer (a single node does no file reads at all)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from hubpool_core.periodic import Periodic
from hubpool_core.pressure import PressureSource
from hubpool_core.signals.pressure_bands import BandQuantiser, wire_source_name

log = logging.getLogger("hubpool.pressure")

SAMPLE_INTERVAL_S = 10.0


class PressureSampler:
    def __init__(self, node: Any, sources: list[PressureSource]):
        self.node = node
        self.sources = sources  # already sorted by order
        self.quantiser = BandQuantiser()
        self.source: str | None = None
        self._loop = Periodic("pressure sample", self._tick, lambda: SAMPLE_INTERVAL_S)

    @property
    def band(self) -> int | None:
        return self.quantiser.band

    def start(self) -> None:
        if self.sources:
            self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def _tick(self) -> None:
        if await asyncio.to_thread(self._has_connected_peer):
            await self.sample_once()

    def _has_connected_peer(self) -> bool:
        return any(p.status == "connected" for p in self.node.peers.all())

    async def sample_once(self) -> int | None:
        """Try the sources in order; the first that answers wins. None: cannot measure."""
        for source in self.sources:
            try:
                reading = await asyncio.to_thread(source.read)
            except Exception as exc:  # noqa: BLE001 - a plugin bug reads as "cannot measure"
                log.debug("pressure source %s raised %s", source.name, exc)
                reading = None
            if isinstance(reading, (int, float)) and not isinstance(reading, bool) and 0 <= reading <= 1:
                if self.source != source.name:
                    self.quantiser.reset()  # a different instrument starts its own history
                    self.source = source.name
                return self.quantiser.feed(float(reading))
        if self.source is not None:
            log.info("GPU pressure is no longer measurable here; reporting none")
        self.source = None
        self.quantiser.reset()
        return None

    def capabilities_fields(self) -> dict[str, Any]:
        """Omitted when unmeasured, never sent as 0 (absent means neutral, never idle)."""
        if self.band is None or self.source is None:
            return {}
        return {"gpuPressure": self.band, "gpuPressureSource": wire_source_name(self.source)}
