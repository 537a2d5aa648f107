"""Withholding an engine for a model after repeated faults (spec: "A 200 that is not an
answer", "When a node lists a model it cannot actually serve").

Two faults within five minutes withhold (node, engine, model) for 60 s; a fault on the
re-probe after that doubles it, up to 15 minutes; one clean answer clears it outright.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

STRIKE_WINDOW_S = 300.0
#: dropped connections this close together are one event: a node dying cuts every stream it
#: was serving at once, and that is one fault of the node, not fourteen of its engine
SAME_EVENT_S = 1.0
DROPPED = "connection dropped"
BASE_WITHHOLD_S = 60.0
MAX_WITHHOLD_S = 900.0

Key = tuple[str, str, str]  # (node, engine kind, folded model id)


@dataclass
class _Record:
    strikes: list[float] = field(default_factory=list)
    level: int = 0  # how many times withheld in a row
    until: float | None = None
    reason: str = ""


class Quarantine:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._records: dict[Key, _Record] = {}

    def strike(self, key: Key, reason: str) -> bool:
        """Count a fault; True when this strike withholds the engine (log it once)."""
        now = self.clock()
        rec = self._records.setdefault(key, _Record())
        rec.reason = reason
        if rec.until is not None and now < rec.until:
            return False  # already withheld
        if DROPPED in reason and rec.strikes and now - rec.strikes[-1] < SAME_EVENT_S:
            return False  # the same connection loss as the last strike
        if rec.level > 0:  # the re-probe after a withhold failed: back off further
            rec.level += 1
        else:
            rec.strikes = [t for t in rec.strikes if now - t < STRIKE_WINDOW_S] + [now]
            if len(rec.strikes) < 2:
                return False
            rec.level = 1
        rec.until = now + min(MAX_WITHHOLD_S, BASE_WITHHOLD_S * 2 ** (rec.level - 1))
        rec.strikes = []
        return True

    def withheld(self, key: Key) -> bool:
        rec = self._records.get(key)
        return rec is not None and rec.until is not None and self.clock() < rec.until

    def clear(self, key: Key) -> bool:
        """A clean, complete answer ends it; True when there was something to clear."""
        return self._records.pop(key, None) is not None

    def withheld_models(self, node: str, engine: str) -> set[str]:
        now = self.clock()
        return {k[2] for k, r in self._records.items()
                if k[0] == node and k[1] == engine and r.until is not None and now < r.until}

    def snapshot(self) -> list[dict]:
        now = self.clock()
        return [{"node": k[0], "backend": k[1], "model": k[2], "reason": r.reason,
                 "withheldForMs": int((r.until - now) * 1000)}
                for k, r in self._records.items() if r.until is not None and now < r.until]
