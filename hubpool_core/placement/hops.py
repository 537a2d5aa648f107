"""How long a signed call to each peer takes to come back: the hop a request placed on that
peer pays before its engine sees it, which a local engine does not (hubpool's own;
docs/placement.md, "The hop"). Timed on the health and busy load polls, which are the same
signed HTTP a forward rides on. In memory only; a restart measures again.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

#: round trips kept per peer; the median of them is the hop (a poll that found the peer
#: re-reading its own engines is one slow reading, not the network)
WINDOW = 8
#: a reading past this is a stall, not a hop (the health poll's own budget is seconds)
MAX_MS = 60_000.0


class HopTimes:
    """peer id -> the last :data:`WINDOW` round trips of a signed call to it, in wall ms.

    ``speedup`` is HUB_POOL_DEV_CLOCK_SPEEDUP (1 outside bench rigs): predictions are on the
    engines' clock, so a hop read off the wall is scaled onto it."""

    def __init__(self, speedup: int = 1) -> None:
        self.speedup = max(1, speedup)
        self._ms: dict[str, deque[float]] = {}

    def record(self, peer_id: str, ms: float) -> None:
        """One answered round trip to ``peer_id``."""
        if not isinstance(ms, (int, float)) or not math.isfinite(ms) or not 0 <= ms <= MAX_MS:
            return
        self._ms.setdefault(peer_id, deque(maxlen=WINDOW)).append(float(ms))

    def readings(self, peer_id: str) -> int:
        """How many round trips to ``peer_id`` the median is taken over."""
        return len(self._ms.get(peer_id, ()))

    def wall_ms(self, peer_id: str) -> float | None:
        """The median round trip to ``peer_id``; ``None`` before one was timed."""
        got = self._ms.get(peer_id)
        return statistics.median(got) if got else None

    def engine_ms(self, peer_id: str | None) -> float:
        """The hop on the engines' clock, as a prediction counts it: 0 for a local engine or a
        peer never timed (it is then ranked as before hops were priced)."""
        wall = self.wall_ms(peer_id) if peer_id is not None else None
        return 0.0 if wall is None else wall * self.speedup
