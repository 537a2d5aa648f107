"""The routing log: a bounded, in-memory ring of routing decisions with cursors.

Metadata only — never a prompt, a body or a header. Rows are plain dicts in the wire
shape so serving them costs no conversion; ``updatedAt`` drives the ``since`` cursor.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from datetime import datetime, timezone
from typing import Any

DEFAULT_CAPACITY = 200
MAX_CAPACITY = 10_000
DEFAULT_PAGE = 200

PLACEMENT_SECTIONS = ("pin", "promptCeiling", "contextCap", "slots", "throughput", "contention", "affinity")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_since(raw: str) -> datetime:
    """ISO 8601 with a zone (Z or an offset); anything else raises ValueError."""
    value = datetime.fromisoformat(raw.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    if value.tzinfo is None:
        raise ValueError("since must carry a zone (Z or an offset such as %2B02:00)")
    return value


def _ts(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


class RoutingLog:
    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        self.capacity = max(DEFAULT_CAPACITY, min(MAX_CAPACITY, capacity))
        self.rows: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.boot_id = str(uuid.uuid4())
        self.started_at = now_iso()
        self.total_recorded = 0

    def open(self, *, direction: str, path: str, model: str | None, request_id: str | None = None,
             **fields: Any) -> dict[str, Any]:
        """Open a row ``pending`` at placement; the caller settles it in place."""
        at = now_iso()
        row: dict[str, Any] = {
            "id": request_id or str(uuid.uuid4()),
            "at": at,
            "updatedAt": at,
            "direction": direction,
            "path": path,
            "model": model,
            "node": None,
            "peerId": None,
            "backend": None,
            "candidates": 0,
            "attempt": 0,
            "failedOverFrom": [],
            "attempts": [],
            **{section: None for section in PLACEMENT_SECTIONS},
            "outcome": "pending",
            "status": None,
            "durationMs": None,
            "totalMs": None,
            "usage": None,
            "stream": None,
            "bodyBytes": None,
            "budgetMs": None,
            "reason": None,
            "requestError": None,
            "clientClosed": False,
        }
        row.update(fields)
        if row["id"] in self.rows:  # an id reused (a peer re-sending): keep ids unique in the ring
            self.rows.pop(row["id"])
        self.rows[row["id"]] = row
        self.total_recorded += 1
        while len(self.rows) > self.capacity:
            self.rows.popitem(last=False)
        return row

    def touch(self, row: dict[str, Any], **changes: Any) -> None:
        row.update(changes)
        row["updatedAt"] = now_iso()

    def query(self, limit: int | None = None, since: datetime | None = None) -> dict[str, Any]:
        limit = DEFAULT_PAGE if limit is None else limit
        rows = list(self.rows.values())
        if since is None:
            matched = rows
            page = sorted(matched, key=lambda r: r["at"], reverse=True)[:limit]
            next_since = max((r["updatedAt"] for r in rows), default=None)
        else:
            matched = sorted((r for r in rows if _ts(r["updatedAt"]) >= since), key=lambda r: r["updatedAt"])
            kept = matched[:limit]  # a cut cursor page keeps the oldest changes
            next_since = max((r["updatedAt"] for r in kept), default=None)
            if next_since is None:
                next_since = since.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
            page = sorted(kept, key=lambda r: r["at"], reverse=True)
        return {"entries": page, "summary": self.summary(), "matched": len(matched), "nextSince": next_since}

    def summary(self) -> dict[str, Any]:
        rows = list(self.rows.values())
        served = sum(1 for r in rows if r["outcome"] == "served")
        pending = sum(1 for r in rows if r["outcome"] == "pending")
        request_errors = sum(
            1 for r in rows if r["requestError"] and r["requestError"].get("basis") != "node"
        )
        output_faults = sum(1 for r in rows if r["requestError"] and r["requestError"].get("basis") == "node")
        return {
            "recorded": len(rows),
            "capacity": self.capacity,
            "served": served,
            "failed": len(rows) - served - pending,
            "pending": pending,
            "failovers": sum(1 for r in rows if r["failedOverFrom"]),
            "clientClosed": sum(1 for r in rows if r["clientClosed"]),
            "requestErrors": request_errors,
            "outputFaults": output_faults,
            "lastAt": max((r["at"] for r in rows), default=None),
            "oldestAt": min((r["at"] for r in rows), default=None),
            "totalRecorded": self.total_recorded,
            "bootId": self.boot_id,
            "startedAt": self.started_at,
        }
