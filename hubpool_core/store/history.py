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

from sqlalchemy import String, delete, func, insert, select

from hubpool_core.store.db import UNREACHABLE, Database, describe, storage_refusal
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


#: each text column's width, from the table itself (VARCHAR(n) on PostgreSQL refuses a longer value)
_WIDTHS = {c.name: c.type.length for c in history_table.columns if isinstance(c.type, String) and c.type.length}
_INT_RANGE = (-(2**31), 2**31 - 1)  # an INTEGER column


def column_text(value: Any, column: str) -> str | None:
    """``value`` as its column can hold it: text without NUL (PostgreSQL's text refuses it) or
    lone surrogates (not UTF-8), cut to the column's width. The row's JSON keeps it whole."""
    if value is None:
        return None
    text = str(value)
    if not text.isprintable() or len(text) > _WIDTHS[column]:  # the common case costs one scan
        text = text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")[:_WIDTHS[column]]
    return text


def _status(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and _INT_RANGE[0] <= value <= _INT_RANGE[1]:
        return value
    return None


def is_outage(exc: BaseException) -> bool:
    """The database is down, full or locked: worth the batch's retry. Anything else a database
    says about one write (a value too long, a NUL, out of range) is about the data."""
    return isinstance(exc, UNREACHABLE) or storage_refusal(exc) is not None


class HistoryWriteStopped(Exception):
    """The database went away part-way through a batch written row by row: ``unwritten`` are the
    rows still to write (the recorder keeps them for its next try), ``written`` those that went."""

    def __init__(self, cause: BaseException, written: int, unwritten: list[dict[str, Any]]):
        super().__init__(str(cause))
        self.written = written
        self.unwritten = unwritten


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


class HistoryStore:
    """One history database (already migrated by the caller)."""

    def __init__(self, db: Database):
        self.db = db
        #: rows the database refused, each dropped on its own (the rest of its batch was written)
        self.refused = 0

    @staticmethod
    def _values(r: dict[str, Any], boot_id: str) -> dict[str, Any]:
        return {
            "request_id": column_text(r["id"], "request_id"), "boot_id": column_text(boot_id, "boot_id"),
            "at": _at(r["at"]), "direction": column_text(r["direction"], "direction"),
            "path": column_text(r.get("path"), "path"), "model": column_text(r.get("model"), "model"),
            "node": column_text(r.get("node"), "node"), "outcome": column_text(r["outcome"], "outcome"),
            "status": _status(r.get("status")), "row": r,
        }

    def write(self, rows: Sequence[dict[str, Any]], boot_id: str) -> int:
        """Insert settled rows in one transaction; returns how many were written.

        When the database refuses the batch for its data (not because it is down, full or
        locked), the rows are written one by one and only a row it refuses is dropped, counted
        in :attr:`refused` and said once at WARNING: one bad row never holds back the rest, nor
        every batch after it. An outage part-way raises :class:`HistoryWriteStopped` with the
        rows still to write."""
        if not rows:
            return 0
        if self.db.migration_pending and not self.db.probe():  # down at start: migrated once it answers
            raise ConnectionError(f"history database unreachable ({self.db.last_error})")
        try:
            values = [self._values(r, boot_id) for r in rows]
            with self.db.engine.begin() as conn:
                conn.execute(insert(history_table), values)
            return len(values)
        except Exception as exc:  # noqa: BLE001 - sorted below: an outage is retried, bad data is not
            if is_outage(exc):
                raise
        return self._row_by_row(rows, boot_id)

    def _row_by_row(self, rows: Sequence[dict[str, Any]], boot_id: str) -> int:
        written = 0
        for i, r in enumerate(rows):
            try:
                value = self._values(r, boot_id)
                with self.db.engine.begin() as conn:
                    conn.execute(insert(history_table), [value])
            except Exception as exc:  # noqa: BLE001 - one row's fault is that row's alone
                if is_outage(exc):
                    raise HistoryWriteStopped(exc, written, list(rows[i:])) from exc
                self._refuse(r, exc)
                continue
            written += 1
        return written

    def _refuse(self, row: Any, exc: BaseException) -> None:
        self.refused += 1
        rid = str(row.get("id"))[:64] if isinstance(row, dict) else "?"
        level = logging.WARNING if self.refused == 1 else logging.DEBUG  # said once; counted always
        log.log(level, "routing history: the database refused row %s and it was dropped (%s); the rest of its "
                "batch was written. Later refusals are counted in /status history.refused, not logged",
                rid, describe(exc))

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
