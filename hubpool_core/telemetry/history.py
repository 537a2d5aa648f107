"""Routing history, off the hot path: a background step that finds the ring's newly settled rows
and hands them to a writer in one batch per interval (docs/history.md).

The request path is not touched: nothing is called per request. Every ``flush_s`` the step
looks at the rows opened since its last look (the ring's newest ``total_recorded`` delta) and at
the rows it saw still in flight; a row is settled once its ``totalMs`` is set (the relay sets it
last, as the ring's own compaction relies on). Settled rows are copied exactly as the ring holds
them and written in one transaction off the event loop. A crash loses at most what settled since
the last write: one batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from hubpool_core.periodic import Periodic
from hubpool_core.telemetry.routing_log import RoutingLog

log = logging.getLogger("hubpool.history")

DEFAULT_FLUSH_S = 2.0
#: rows in flight followed at once; beyond it the oldest is given up (a stream open for hours)
MAX_WATCHED = 20_000
#: settled rows held while the history database is unreachable; beyond it the oldest are dropped
MAX_BACKLOG = 50_000
PRUNE_EVERY_S = 3600.0
#: a row touched this recently waits for the next look even with its totalMs set: one path
#: settles a row and then, after an await, corrects its status (a 502 that is the app's 404)
SETTLE_GRACE_MS = 250


class HistoryWriter(Protocol):
    """Where settled rows go (hubpool_core.store.history.HistoryStore).

    ``write`` returns how many rows it wrote; one it cannot write for its data is dropped there
    (and counted), so fewer than given is not an error. An exception means the database is out
    of reach: the batch is kept and tried again, or, when the exception carries ``unwritten``
    (an outage part-way through), only those rows, with ``written`` counted as done."""

    def write(self, rows: list[dict[str, Any]], boot_id: str) -> int: ...
    def prune(self, retention_days: float) -> int: ...


def settled_copy(stored: dict[str, Any] | tuple[Any, ...]) -> dict[str, Any]:
    """The row in the wire shape, as the ring serves it, with lists of its own."""
    row = dict(RoutingLog._as_dict(stored))  # noqa: SLF001 - the ring's own tuple-to-row reading
    for key in ("failedOverFrom", "attempts"):
        if isinstance(row.get(key), (list, tuple)):
            row[key] = list(row[key])
    return row


def _settled(row: dict[str, Any], now_ms: float) -> bool:
    if row["totalMs"] is None:
        return False
    try:
        touched = datetime.fromisoformat(row["updatedAt"].replace("Z", "+00:00")).timestamp() * 1000
    except (AttributeError, ValueError):
        return True
    return now_ms - touched >= SETTLE_GRACE_MS


class HistoryRecorder:
    def __init__(self, ring: RoutingLog, writer: HistoryWriter, *, flush_s: float = DEFAULT_FLUSH_S,
                 retention_days: float, clock: Callable[[], float] = time.monotonic):
        self.ring = ring
        self.writer = writer
        self.flush_s = flush_s
        self.retention_days = retention_days
        self._clock = clock
        self._seen_total = ring.total_recorded
        #: rows seen in flight: id -> the ring's dict, which the relay keeps updating in place
        self._watching: OrderedDict[int, dict[str, Any]] = OrderedDict()
        #: settled rows not yet written (one batch, or more while the database is down)
        self._backlog: list[dict[str, Any]] = []
        self._next_prune = 0.0
        self._writing = asyncio.Lock()
        self.written = 0
        self.batches = 0
        self.dropped = 0
        #: rows the database refused for their data, each dropped alone (its batch was written)
        self.refused = 0
        self.last_error: str | None = None
        self._periodic = Periodic("routing history", self.flush, lambda: self.flush_s)

    def collect(self) -> None:
        """Move settled rows into the backlog. Runs on the event loop, where the rows change."""
        ring = self.ring
        now_ms = time.time() * 1000
        new = ring.total_recorded - self._seen_total
        self._seen_total = ring.total_recorded
        if new > 0:
            fresh: list[dict[str, Any] | tuple[Any, ...]] = []
            for stored in reversed(ring.rows.values()):
                if len(fresh) >= new:
                    break
                fresh.append(stored)
            if new > len(fresh):  # opened and evicted between two looks: a ring far too small
                self.dropped += new - len(fresh)
            for stored in reversed(fresh):
                if type(stored) is dict and not _settled(stored, now_ms):
                    self._watching[id(stored)] = stored
                else:  # a tuple is a row the ring itself compacted: finished
                    self._backlog.append(settled_copy(stored))
        for key, row in list(self._watching.items()):
            if _settled(row, now_ms):
                del self._watching[key]
                self._backlog.append(settled_copy(row))
        while len(self._watching) > MAX_WATCHED:
            self._watching.popitem(last=False)
            self.dropped += 1
        if len(self._backlog) > MAX_BACKLOG:
            self.dropped += len(self._backlog) - MAX_BACKLOG
            del self._backlog[:len(self._backlog) - MAX_BACKLOG]

    async def flush(self) -> None:
        """One batch: collect, write in a thread, prune now and then."""
        async with self._writing:
            self.collect()
            batch, self._backlog = self._backlog, []
            if batch:
                try:
                    written = await asyncio.to_thread(self.writer.write, batch, self.ring.boot_id)
                except Exception as exc:  # noqa: BLE001 - kept for the next try; the ring is unaffected
                    left = getattr(exc, "unwritten", None)
                    kept = left if isinstance(left, list) else batch
                    self.written += getattr(exc, "written", 0) if kept is left else 0
                    self._backlog[:0] = kept
                    if self.last_error is None:
                        log.warning("routing history: could not write %d rows (%s); kept in memory and retried",
                                    len(kept), exc)
                    self.last_error = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
                    return
                if self.last_error is not None:
                    log.info("routing history: writing again")
                self.last_error = None
                written = written if isinstance(written, int) else len(batch)
                self.written += written
                self.refused += max(0, len(batch) - written)
                self.batches += 1
            if self._clock() >= self._next_prune:
                self._next_prune = self._clock() + PRUNE_EVERY_S
                try:
                    await asyncio.to_thread(self.writer.prune, self.retention_days)
                except Exception as exc:  # noqa: BLE001 - pruning waits for the next hour
                    log.warning("routing history: pruning failed (%s)", exc)

    def start(self) -> None:
        self._periodic.start()

    async def stop(self) -> None:
        """A clean stop writes everything that settled (a write in progress is let finish)."""
        async with self._writing:
            await self._periodic.stop()
        await self.flush()

    def status(self) -> dict[str, Any]:
        return {"enabled": True, "flushMs": int(self.flush_s * 1000), "retentionDays": self.retention_days,
                "written": self.written, "batches": self.batches, "backlog": len(self._backlog),
                "inFlight": len(self._watching), "dropped": self.dropped, "refused": self.refused,
                "error": self.last_error}
