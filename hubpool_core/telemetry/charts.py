"""The Hub Pool page's charts: routing-log rows folded into per-minute series.

Input is rows in the routing log's wire shape (the in-memory ring today; the persisted history
can feed the same function for a longer window), output is what the page draws and tabulates:

- requests per minute, per node that served them;
- time to first byte (``durationMs``: to the first response headers) p50 and p95 per node and
  minute, from answers below 400 only (a refusal in 5 ms is not a fast first byte: the spec's
  dashboard note);
- queue depth per node: the most of this node's requests in flight there at once during the
  minute, from each row's start (``at``) and length (``totalMs``; still open: until now). It is
  the same count the proxy ranks candidates by, rebuilt from the log;
- failovers and failures per minute, and the reasons nodes were passed over, counted.

Only outbound rows count: they are the requests this node placed. An inbound row is a peer's
request that peer already counted on its own page.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

#: the windows the page offers: name -> (seconds, bucket seconds)
WINDOWS: dict[str, tuple[int, int]] = {"hour": (3600, 60), "day": (86_400, 900)}
#: reasons listed by count, most first; the rest are summed into one line
MAX_REASONS = 12


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of a non-empty list (p50 of [1, 2, 3, 4] is 2): a figure that was
    measured, never an interpolation between two requests."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def window_bounds(now: float, window: str) -> tuple[int, int]:
    """(start, end) in epoch seconds: whole buckets, the last one holding ``now``."""
    span, step = WINDOWS[window]
    end = math.floor(now / step) * step + step
    return end - span, end


def chart_series(rows: Iterable[dict[str, Any]], now: float, window: str = "hour") -> dict[str, Any]:
    """The page's series for ``window`` ending at ``now`` (epoch seconds)."""
    span, step = WINDOWS[window]
    start, end = window_bounds(now, window)
    count = span // step
    buckets = [start + i * step for i in range(count)]
    requests: dict[str, list[int]] = defaultdict(lambda: [0] * count)
    ttfb: dict[str, list[list[float]]] = defaultdict(lambda: [[] for _ in range(count)])
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    failovers, failures = [0] * count, [0] * count
    reasons: Counter[str] = Counter()
    reason_nodes: dict[str, set[str]] = defaultdict(set)
    seen = 0
    oldest: float | None = None
    oldest_iso: str | None = None
    for row in rows:
        if row.get("direction") != "outbound" or not row.get("at"):
            continue
        at = _epoch(row["at"])
        if oldest is None or at < oldest:
            oldest, oldest_iso = at, row["at"]
        total = row.get("totalMs")
        # a request is in flight for at least a millisecond, so one that took "0 ms" still counts
        finish = max(at + total / 1000 if total is not None else now, at + 0.001)
        node = row.get("node")
        if node and row.get("outcome") in ("served", "pending") and finish >= start:
            spans[node].append((at, finish))
        if not start <= at < end:
            continue
        seen += 1
        i = int((at - start) // step)
        outcome, status = row.get("outcome"), row.get("status")
        if outcome == "served" and node:
            requests[node][i] += 1
            if row.get("durationMs") is not None and (status is None or status < 400):
                ttfb[node][i].append(float(row["durationMs"]))
        elif outcome == "failed":
            failures[i] += 1
        if row.get("failedOverFrom"):
            failovers[i] += 1
        for attempt in row.get("attempts") or []:
            reason = str(attempt.get("reason") or "no reason recorded")
            reasons[reason] += 1
            if attempt.get("node"):
                reason_nodes[reason].add(str(attempt["node"]))
        if outcome == "failed" and not row.get("attempts") and row.get("reason"):
            reasons[str(row["reason"])] += 1  # a walk with nothing passed over still says why
    nodes = sorted(set(requests) | set(spans), key=lambda n: (n != "local", n))
    top = reasons.most_common(MAX_REASONS)
    rest = sum(reasons.values()) - sum(n for _, n in top)
    reason_rows = [{"reason": r, "count": n, "nodes": sorted(reason_nodes.get(r, ()))} for r, n in top]
    if rest:
        reason_rows.append({"reason": "other reasons", "count": rest, "nodes": []})
    return {
        "window": window,
        "bucketSeconds": step,
        "from": _iso(start),
        "to": _iso(end),
        "buckets": buckets,
        "nodes": nodes,
        "requests": {n: requests[n] if n in requests else [0] * count for n in nodes},
        "ttfbP50": {n: [percentile(v, 50) if v else None for v in ttfb[n]] for n in nodes},
        "ttfbP95": {n: [percentile(v, 95) if v else None for v in ttfb[n]] for n in nodes},
        "queueDepth": {n: _peak_in_flight(spans.get(n, []), buckets, step) for n in nodes},
        "failovers": failovers,
        "failures": failures,
        "reasons": reason_rows,
        "rows": seen,
        "oldestRow": oldest_iso,
        # the rows reach back to the window's start, so its first minutes are not missing any
        "reachesBack": oldest is not None and oldest <= start,
    }


def _peak_in_flight(spans: list[tuple[float, float]], buckets: list[int], step: int) -> list[int]:
    """For each bucket, the most spans open at one moment inside it (a sweep over start and end
    events; an end sorts before a start at the same instant, so back-to-back requests are one)."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda ev: (ev[0], ev[1]))
    out: list[int] = []
    open_now, j = 0, 0
    for b in buckets:
        while j < len(events) and events[j][0] < b:  # everything before this bucket: its opening level
            open_now += events[j][1]
            j += 1
        peak = open_now
        while j < len(events) and events[j][0] < b + step:
            open_now += events[j][1]
            peak = max(peak, open_now)
            j += 1
        out.append(peak)
    return out
