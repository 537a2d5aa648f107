"""Routing history in a database: settled routing-log rows, written in batches, read with
filters, pruned by age (docs/history.md).

The row is stored exactly as the ring held it (``row``, JSON); ``at``, ``direction``, ``model``,
``node``, ``outcome`` and ``status`` are copied into columns so a filter is a query, not a scan.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, insert, select

from hubpool_core.store.db import Database
from hubpool_core.store.models import history_table

log = logging.getLogger("hubpool.history")

DEFAULT_RETENTION_DAYS = 30
MAX_PAGE = 10_000


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_when(raw: str, now: datetime | None = None) -> datetime:
    """A point in time from ``2h`` / ``30m`` / ``7d`` / ``90s`` / ``1w`` (that long ago) or ISO 8601
    with a zone. ValueError says what is accepted."""
    text = raw.strip().lower()
    if len(text) >= 2 and text[-1] in _UNITS and text[:-1].replace(".", "", 1).isdigit():
        return (now or datetime.now(UTC)) - timedelta(seconds=float(text[:-1]) * _UNITS[text[-1]])
    try:
        value = datetime.fromisoformat(raw.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        value = None
    if value is None or value.tzinfo is None:
        raise ValueError(f"{raw!r} is not a time: give a duration ago (90s, 30m, 2h, 7d, 1w) or ISO 8601 with "
                         "a zone (2026-12-01T09:00:00Z)")
    return value


def _at(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


class HistoryStore:
    """One history database (already migrated by the caller)."""

    def __init__(self, db: Database):
        self.db = db

    def write(self, rows: Sequence[dict[str, Any]], boot_id: str) -> int:
        """Insert settled rows in one transaction: all of them or none."""
        if not rows:
            return 0
        if self.db.migration_pending and not self.db.probe():  # down at start: migrated once it answers
            raise ConnectionError(f"history database unreachable ({self.db.last_error})")
        values = [{
            "request_id": str(r["id"])[:64], "boot_id": boot_id, "at": _at(r["at"]),
            "direction": r["direction"], "path": r.get("path"), "model": r.get("model"), "node": r.get("node"),
            "outcome": r["outcome"], "status": r.get("status"), "row": r,
        } for r in rows]
        with self.db.engine.begin() as conn:
            conn.execute(insert(history_table), values)
        return len(values)

    def query(self, *, since: datetime | None = None, until: datetime | None = None, model: str | None = None,
              node: str | None = None, outcome: str | None = None, direction: str | None = None,
              limit: int = 1000) -> dict[str, Any]:
        """Rows newest first, each exactly as the ring held it; ``matched`` counts every hit."""
        t = history_table
        where = []
        if since is not None:
            where.append(t.c.at >= since)
        if until is not None:
            where.append(t.c.at < until)
        if model:
            where.append(t.c.model == model)
        if node:
            # the short name an operator types (hub-b) or the whole tailnet name, or "local"
            where.append((t.c.node == node) | t.c.node.like(f"{node}.%"))
        if outcome:
            where.append(t.c.outcome == outcome)
        if direction:
            where.append(t.c.direction == direction)
        with self.db.engine.connect() as conn:
            matched = conn.scalar(select(func.count()).select_from(t).where(*where)) or 0
            rows = conn.execute(select(t.c.row).where(*where).order_by(t.c.at.desc(), t.c.seq.desc())
                                .limit(max(1, min(limit, MAX_PAGE)))).scalars().all()
        return {"entries": list(rows), "matched": matched}

    def rows_since(self, since: datetime) -> list[dict[str, Any]]:
        """Every row at or after ``since``, oldest first, as the ring held it (the charts' day)."""
        t = history_table
        with self.db.engine.connect() as conn:
            return list(conn.execute(select(t.c.row).where(t.c.at >= _aware(since))
                                     .order_by(t.c.at, t.c.seq)).scalars().all())

    def prune(self, retention_days: float, now: datetime | None = None) -> int:
        """Delete rows older than the retention; returns how many went."""
        cutoff = (now or datetime.now(UTC)) - timedelta(days=retention_days)
        with self.db.engine.begin() as conn:
            gone = conn.execute(delete(history_table).where(history_table.c.at < cutoff)).rowcount or 0
        if gone:
            log.info("routing history: pruned %d rows older than %g days", gone, retention_days)
        return gone

    def oldest(self) -> datetime | None:
        with self.db.engine.connect() as conn:
            value = conn.scalar(select(func.min(history_table.c.at)))
        return _aware(value) if value is not None else None
