"""Which models this node's engines hold in memory, read off the request path for predicted
time to first token (docs/placement.md) and advertised to peers as ``resident``.

Every engine is asked (:meth:`hubpool_core.engine.Engine.resident_models`) every health-poll
interval; one that cannot say and has no residency API is read as serving what it lists (its
last probe's inventory), as the spec's memory manager reads vLLM and oMLX. A read that fails or cannot
say leaves the engine unknown, which placement never takes for cold.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from hubpool_core.periodic import Periodic

#: how long one engine's residency read may take
READ_TIMEOUT_S = 5.0


class ResidencySampler:
    """Refreshes ``view`` (a :class:`hubpool_core.placement.speed.ResidencyView`, under the
    node name ``"local"``) from ``local``'s engines every ``interval()`` seconds."""

    def __init__(self, local: Any, view: Any, interval: Callable[[], float]):
        self.local, self.view = local, view
        self._loop = Periodic("residency read", self.sample, interval)

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def sample(self) -> None:
        await asyncio.gather(*(self._one(i, engine) for i, engine in enumerate(self.local.engines)))

    async def _one(self, index: int, engine: Any) -> None:
        snapshot = self.local.last_snapshot(index)
        if snapshot is None or not (snapshot.result.running and snapshot.result.healthy):
            self.view.set("local", engine.kind, None)
            return
        try:
            held = await asyncio.wait_for(engine.resident_models(self.local.http), READ_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - no answer says nothing: unknown
            held = None
        if held is None and not engine.has_residency:  # no API to ask: what it lists is loaded
            self.view.set("local", engine.kind, [m.id for m in snapshot.result.models])
            return
        self.view.set("local", engine.kind, None if held is None else [r.id for r in held])
