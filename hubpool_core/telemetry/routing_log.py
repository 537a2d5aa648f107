"""The routing log: a bounded, in-memory ring of routing decisions with cursors.

Metadata only — never a prompt, a body or a header. Rows are plain dicts in the wire
shape so serving them costs no conversion; ``updatedAt`` drives the ``since`` cursor.

Bounded in what it holds, not only in how many rows (issue 26, docs/reliability.md "The
edge"): every string a row keeps is cut to :data:`MAX_TEXT` characters, the bound of the
history's columns, because a model name comes from whoever sent the request (a caller put
2 MiB in ``X-Hub-Pool-Model`` and the ring kept it). A refusal of a caller the peer guard did
not admit goes to a small ring of its own (:data:`REFUSAL_CAPACITY`) under an id this node
mints, so a flood of them can neither push real decisions out of the ring nor replace a row
by naming its id; they are counted in ``summary.unauthenticatedRefusals``.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict, deque
from datetime import UTC, datetime
from typing import Any

DEFAULT_CAPACITY = 200
MAX_CAPACITY = 10_000
DEFAULT_PAGE = 200
#: the longest string a row keeps (the routing history's columns hold as much)
MAX_TEXT = 300
#: refusals of unauthenticated callers kept, in a ring of their own beside the decisions
REFUSAL_CAPACITY = 50

PLACEMENT_SECTIONS = ("pin", "promptCeiling", "contextCap", "slots", "throughput", "contention", "affinity", "ttft")
#: a row's fields in the order open() builds them. A finished row in this shape is kept as a
#: tuple of its values (about half the memory of the dict: 10,000 rows are G7's budget)
ROW_KEYS: tuple[str, ...] = (
    "id", "at", "updatedAt", "direction", "path", "model", "node", "peerId", "backend", "candidates", "attempt",
    "failedOverFrom", "attempts", *PLACEMENT_SECTIONS, "outcome", "status", "durationMs", "totalMs", "usage",
    "stream", "bodyBytes", "budgetMs", "reason", "requestError", "clientClosed", "queuedMs",
    # the spec's reason a local load was refused on a row served there anyway: hubpool has no
    # memory manager, so nothing refuses a load and it is always null (kept for the contract)
    "localLoadRefused",
    # hubpool's own: the model the app asked for when an alias or `auto` placed another, else null
    "requestedModel",
)
_INDEX = {key: i for i, key in enumerate(ROW_KEYS)}
_LIST_FIELDS = (_INDEX["failedOverFrom"], _INDEX["attempts"])
_TOTAL = _INDEX["totalMs"]
#: a new row before open() fills in the request's own fields (the lists are new per row)
_TEMPLATE: dict[str, Any] = {**dict.fromkeys(ROW_KEYS), "candidates": 0, "attempt": 0, "outcome": "pending",
                             "clientClosed": False}
#: finished rows looked at per open(): keeps up with any request rate at O(1) a request
_COMPACT_PER_OPEN = 4


#: (whole second, its "YYYY-MM-DDTHH:MM:SS" text): a row is stamped four or five times per
#: request, and formatting a datetime each time was 7 % of a non-streamed request's CPU
_second: list[Any] = [-1, ""]


def now_iso() -> str:
    """UTC now as ISO 8601 with milliseconds and a Z (2026-11-30T21:26:00.123Z)."""
    now = time.time_ns() // 1_000_000
    sec, ms = divmod(now, 1000)
    if sec != _second[0]:
        _second[1] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
        _second[0] = sec
    return f"{_second[1]}.{ms:03d}Z"


def parse_since(raw: str) -> datetime:
    """ISO 8601 with a zone (Z or an offset); anything else raises ValueError."""
    value = datetime.fromisoformat(raw.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    if value.tzinfo is None:
        raise ValueError("since must carry a zone (Z or an offset such as %2B02:00)")
    return value


def _field(key: str) -> Any:
    """A reader of one field from a stored row, dict or compacted tuple alike."""
    i = _INDEX[key]
    return lambda row: row[key] if type(row) is dict else row[i]


def _ts(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


def _cut(value: Any) -> Any:
    """``value`` with every string in it cut to :data:`MAX_TEXT`, lists and dicts walked (a
    row's sections and attempts are a few levels deep). Unchanged objects are returned as
    they are, so a row with nothing long costs a scan and no copy."""
    kind = type(value)
    if kind is str:
        return value if len(value) <= MAX_TEXT else value[:MAX_TEXT]
    if kind is list or kind is tuple:
        cut = [_cut(v) for v in value]
        return value if all(a is b for a, b in zip(cut, value, strict=True)) else kind(cut)
    if kind is dict:
        pairs = {_cut(k): _cut(v) for k, v in value.items()}
        return value if all(a is b for a, b in zip(pairs.values(), value.values(), strict=True)) \
            and len(pairs) == len(value) else pairs
    return value


def _cut_top(fields: dict[str, Any]) -> None:
    """Cut the long strings among a row's own fields in place (the common case: none)."""
    for key, value in fields.items():
        if type(value) is str and len(value) > MAX_TEXT:
            fields[key] = value[:MAX_TEXT]


class RoutingLog:
    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        self.capacity = max(DEFAULT_CAPACITY, min(MAX_CAPACITY, capacity))
        #: id -> the row: its dict while it can still change, a tuple of its values once finished
        self.rows: OrderedDict[str, dict[str, Any] | tuple[Any, ...]] = OrderedDict()
        #: rows still held as dicts, oldest first, to be compacted once finished
        self._loose: deque[dict[str, Any]] = deque()
        self.boot_id = str(uuid.uuid4())
        self.started_at = now_iso()
        self.total_recorded = 0
        #: refusals of callers no guard admitted, newest last, apart from the decisions
        self.refusals: deque[dict[str, Any]] = deque(maxlen=REFUSAL_CAPACITY)
        self.unauthenticated_refusals = 0

    def open(self, *, direction: str, path: str, model: str | None, request_id: str | None = None,
             **fields: Any) -> dict[str, Any]:
        """Open a row ``pending`` at placement; the caller settles it in place."""
        at = now_iso()
        row = _TEMPLATE.copy()  # a copy of a prepared dict: a literal of 31 keys cost more
        row["id"] = request_id or str(uuid.uuid4())
        row["at"] = row["updatedAt"] = at
        row["direction"], row["path"], row["model"] = direction, path, model
        row["failedOverFrom"], row["attempts"] = [], []
        row.update(fields)
        _cut_top(row)
        if row["id"] in self.rows:  # an id reused (a peer re-sending): keep ids unique in the ring
            self.rows.pop(row["id"])
        self.rows[row["id"]] = row
        self.total_recorded += 1
        while len(self.rows) > self.capacity:
            self.rows.popitem(last=False)
        self._compact()
        self._loose.append(row)
        return row

    def open_refusal(self, *, direction: str, path: str, model: str | None, **fields: Any) -> dict[str, Any]:
        """A row for a caller no guard admitted: kept in :attr:`refusals`, never in the ring of
        decisions, under an id minted here (the caller's would let it replace a real row). The
        caller settles it with :meth:`touch`, as any row."""
        row = _TEMPLATE.copy()
        row["id"] = str(uuid.uuid4())
        row["at"] = row["updatedAt"] = now_iso()
        row["direction"], row["path"], row["model"] = direction, path, model
        row["failedOverFrom"], row["attempts"] = [], []
        row.update(fields)
        _cut_top(row)
        self.refusals.append(row)
        self.unauthenticated_refusals += 1
        return row

    def _compact(self) -> None:
        """Keep a few finished rows as tuples. A row is finished once its totalMs is set: the
        relay sets it last, in the same step as its final touch, so no one writes it after."""
        loose = self._loose
        for _ in range(min(_COMPACT_PER_OPEN, len(loose))):
            row = loose.popleft()
            if self.rows.get(row["id"]) is not row:
                continue  # evicted, or its id reused by a newer row
            if row["totalMs"] is None:
                loose.append(row)  # still in flight (a long stream): looked at again later
                continue
            for key, value in row.items():  # finished: the strings inside its sections are cut too
                if value is not None and type(value) is not str and type(value) is not int:
                    row[key] = _cut(value)
            if tuple(row) != ROW_KEYS:
                continue  # a row with fields of its own stays a dict
            values = list(row.values())
            for i in _LIST_FIELDS:
                if not values[i]:
                    values[i] = ()  # an empty list costs 56 bytes; () is shared
            self.rows[row["id"]] = tuple(values)

    @staticmethod
    def _as_dict(row: dict[str, Any] | tuple[Any, ...]) -> dict[str, Any]:
        if isinstance(row, dict):  # narrows the type; the same check as type() for a dict or a tuple
            return row
        out = dict(zip(ROW_KEYS, row, strict=False))
        for i in _LIST_FIELDS:
            if row[i] == ():
                out[ROW_KEYS[i]] = []
        return out

    def _all(self) -> list[dict[str, Any] | tuple[Any, ...]]:
        """The decisions, then the kept refusals of unauthenticated callers, as stored."""
        rows: list[dict[str, Any] | tuple[Any, ...]] = list(self.rows.values())
        rows.extend(self.refusals)
        return rows

    def entries(self) -> list[dict[str, Any]]:
        """Every row the log holds, oldest first, in the wire shape."""
        rows = self._all()
        if self.refusals:
            rows.sort(key=_field("at"))
        return [self._as_dict(r) for r in rows]

    def touch(self, row: dict[str, Any], **changes: Any) -> None:
        for key, value in changes.items():
            if type(value) is str and len(value) > MAX_TEXT:
                changes[key] = value[:MAX_TEXT]
        row.update(changes)
        row["updatedAt"] = now_iso()

    def query(self, limit: int | None = None, since: datetime | None = None) -> dict[str, Any]:
        limit = DEFAULT_PAGE if limit is None else limit
        rows = self._all()  # as stored: only the page is turned into dicts
        at, updated = _field("at"), _field("updatedAt")
        if since is None:
            matched = rows
            page = sorted(matched, key=at, reverse=True)[:limit]
            next_since = max((updated(r) for r in rows), default=None)
        else:
            matched = sorted((r for r in rows if _ts(updated(r)) >= since), key=updated)
            kept = matched[:limit]  # a cut cursor page keeps the oldest changes
            next_since = max((updated(r) for r in kept), default=None)
            if next_since is None:
                next_since = since.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
            page = sorted(kept, key=at, reverse=True)
        return {"entries": [self._as_dict(r) for r in page], "summary": self.summary(), "matched": len(matched),
                "nextSince": next_since}

    def summary(self) -> dict[str, Any]:
        rows = self._all()
        outcome, error, failed_over = _field("outcome"), _field("requestError"), _field("failedOverFrom")
        closed, at = _field("clientClosed"), _field("at")
        served = sum(1 for r in rows if outcome(r) == "served")
        pending = sum(1 for r in rows if outcome(r) == "pending")
        request_errors = sum(1 for r in rows if (e := error(r)) and e.get("basis") != "node")
        output_faults = sum(1 for r in rows if (e := error(r)) and e.get("basis") == "node")
        return {
            "recorded": len(rows),
            "capacity": self.capacity,
            "served": served,
            "failed": len(rows) - served - pending,
            "pending": pending,
            "failovers": sum(1 for r in rows if failed_over(r)),
            "clientClosed": sum(1 for r in rows if closed(r)),
            "requestErrors": request_errors,
            "outputFaults": output_faults,
            "lastAt": max((at(r) for r in rows), default=None),
            "oldestAt": min((at(r) for r in rows), default=None),
            "totalRecorded": self.total_recorded,
            "unauthenticatedRefusals": self.unauthenticated_refusals,
            "bootId": self.boot_id,
            "startedAt": self.started_at,
        }
