"""Prometheus metrics of one node (docs/metrics.md).

Counters and histograms are fed from the ``hubpool_request_finished`` broadcast, so the
relay is never touched: an in-process observer registered on the node's plugin manager
counts each settled routing-log row once. Gauges are read from the node at scrape time.
Every node has its own :class:`CollectorRegistry` (tests run several nodes in one process).

Label values come from closed sets or from this node's own peer table: a route key, a
direction, an outcome, "local" / "none" / a paired peer's FQDN, a failure kind. Never a
model name (an app can send any string there), a prompt, a header or a session key.
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Iterator
from itertools import accumulate
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from hubpool_core import __version__
from hubpool_core.hookspecs import hookimpl
from hubpool_core.proxy.output_check import DEGENERATE, TRUNCATED

log = logging.getLogger("hubpool.metrics")

#: the classic text format every Prometheus reads (every name here is a legacy-valid name)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PLUGIN_NAME = "metrics"

#: the routes a routing-log row can name (api/inference.py ROUTED); anything else is "other"
ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                    "/api/chat", "/api/generate", "/api/embed", "/api/embeddings",
                    "/v1/messages", "/v1/messages/count_tokens", "/v1/responses", "/v1/rerank"})
DIRECTIONS = frozenset({"outbound", "inbound"})
OUTCOMES = frozenset({"served", "failed"})
REASON_KINDS = ("http_5xx", "http_4xx", "deadline", "transport", "output_fault", "verdict", "other")
RESUME_KINDS = ("stalled", "degenerate-loop", "truncated-upstream", "other")
PROBE_KINDS = ("unreachable", "unauthorized", "identity_changed", "own_identity", "signed_required")
#: peers whose health the poller follows (a pending pairing request is nobody's peer yet)
PAIRED = ("connected", "unreachable")
#: seconds; an LLM answer can take minutes, an embedding milliseconds
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
#: how many settled rows are remembered to count each request once
SEEN_LIMIT = 8192


def reason_kind(attempt: dict[str, Any]) -> str:
    """The closed kind of one passed-over attempt (routing-log ``attempts[]``)."""
    reason = r if isinstance(r := attempt.get("reason"), str) else ""
    status = s if isinstance(s := attempt.get("status"), int) else None
    if reason.startswith(("No response headers within", "no first token within")):
        return "deadline"  # no headers, or headers and nothing real (docs/reliability.md)
    if reason.startswith("fetch failed") or reason.startswith(TRUNCATED + " ("):
        return "transport"  # no answer, or the connection dropped while the body was read
    if reason.startswith("HTTP 500 ("):
        return "verdict"  # an engine's 500 read as a verdict on the request
    if reason in (TRUNCATED, DEGENERATE):
        return "output_fault"  # a 200 that is not an answer
    if status is not None and status >= 500:
        return "http_5xx"
    if status is not None and 400 <= status < 500:
        return "http_4xx"
    return "other"


class _Histogram:
    """Counts per bucket (the first bound at or above the value), made cumulative at a scrape:
    one bisect per observation instead of a pass over every bound on each request."""

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)  # the last one is above every bound
        self.total = 0
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(BUCKETS, seconds)] += 1
        self.total += 1
        self.sum += seconds

    def buckets(self) -> list[tuple[str, float]]:
        # one count more than bounds: the overflow, which only the +Inf total includes
        return [(floatToGoString(b), float(c)) for b, c in zip(BUCKETS, accumulate(self.counts), strict=False)] + [
            ("+Inf", float(self.total))]


class NodeMetrics:
    """The series of one node: counters fed by ``observe(row)``, gauges read at ``collect()``."""

    def __init__(self, node: Any):
        self.node = node
        self.registry = CollectorRegistry(auto_describe=False)
        self._lock = threading.Lock()
        self._seen: OrderedDict[tuple[Any, ...], None] = OrderedDict()
        self.requests: dict[tuple[str, str, str, str], int] = {}
        self.failovers: dict[str, int] = dict.fromkeys(REASON_KINDS, 0)
        #: streams continued on another candidate (poolStreamResume), by what cut them
        self.resumes: dict[str, int] = {}
        self.to_headers: dict[tuple[str, str], _Histogram] = {}
        self.duration: dict[tuple[str, str], _Histogram] = {}
        self.registry.register(self)

    # -- fed by the broadcast ------------------------------------------------------------
    @staticmethod
    def _node_label(value: Any) -> str:
        """Who answered: "local", "none" (no candidate), or the peer's FQDN as this node's
        own peer table names it (the relay writes candidates' names, never a caller's)."""
        if value is None:
            return "none"
        return value[:253] if isinstance(value, str) and value else "none"

    def observe(self, row: dict[str, Any]) -> bool:
        """Count one settled row; False when it was already counted or is still pending."""
        outcome: Any = row.get("outcome")
        if outcome == "pending":
            return False  # not settled: a later broadcast of the same row counts it
        key = (row.get("id"), row.get("direction"), row.get("at"))
        # row[...] once .get() found the value in the set: typed Any, where .get() is Any | None
        route = row["path"] if row.get("path") in ROUTES else "other"
        direction = row["direction"] if row.get("direction") in DIRECTIONS else "other"
        labels = (route, direction, outcome if outcome in OUTCOMES else "other", self._node_label(row.get("node")))
        attempts = row.get("attempts") if direction == "outbound" else None
        kinds = [reason_kind(a) for a in attempts or [] if isinstance(a, dict)]
        with self._lock:
            if key in self._seen:
                return False
            self._seen[key] = None
            while len(self._seen) > SEEN_LIMIT:
                self._seen.popitem(last=False)
            self.requests[labels] = self.requests.get(labels, 0) + 1
            for kind in kinds:
                self.failovers[kind] += 1
            for cut in row.get("resumedFrom") or [] if direction == "outbound" else []:
                reason = cut.get("reason") if isinstance(cut, dict) else None
                kind = str(reason).split(" ", 1)[0] if reason else "other"
                kind = kind if kind in RESUME_KINDS else "other"
                self.resumes[kind] = self.resumes.get(kind, 0) + 1
            for field, series in (("durationMs", self.to_headers), ("totalMs", self.duration)):
                ms = row.get(field)
                if isinstance(ms, (int, float)) and ms >= 0:
                    series.setdefault((route, direction), _Histogram()).observe(ms / 1000)
        return True

    # -- read at scrape time ---------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        with self._lock:
            requests = dict(self.requests)
            failovers = dict(self.failovers)
            resumes = dict(self.resumes)
            to_headers = {k: (h.buckets(), h.sum) for k, h in self.to_headers.items()}
            duration = {k: (h.buckets(), h.sum) for k, h in self.duration.items()}
        m = CounterMetricFamily("hubpool_requests", "Routed requests settled on this node (one per routing-log row)",
                                labels=["route", "direction", "outcome", "node"])
        for labels, count in sorted(requests.items()):
            m.add_metric(list(labels), count)
        yield m
        m = CounterMetricFamily("hubpool_failovers", "Candidates passed over by this node's outbound requests, "
                                "by the kind of failure", labels=["reason_kind"])
        for kind in REASON_KINDS:
            m.add_metric([kind], failovers[kind])
        yield m
        m = CounterMetricFamily("hubpool_stream_resumes", "Streams cut mid-answer and continued on another candidate "
                                "(poolStreamResume), by what cut them", labels=["reason"])
        for kind in RESUME_KINDS:
            m.add_metric([kind], resumes.get(kind, 0))
        yield m
        for name, doc, data in (
                ("hubpool_time_to_headers_seconds", "Time until the answer's headers were sent (routing-log "
                 "durationMs)", to_headers),
                ("hubpool_request_duration_seconds", "Time until the answer ended (routing-log totalMs)", duration)):
            hist = HistogramMetricFamily(name, doc, labels=["route", "direction"])
            for key, (buckets, total) in sorted(data.items()):
                hist.add_metric(list(key), buckets, total)
            yield hist
        yield from self._gauges()

    def _gauges(self) -> Iterator[Metric]:
        node = self.node
        peers = [p for p in node.peers.all() if p.status in PAIRED]
        by_id = {p.id: p.node_fqdn for p in peers}
        m = GaugeMetricFamily("hubpool_in_flight", "Requests handed to an engine and not finished, by target",
                              labels=["target"])
        m.add_metric(["local"], node.load.local)
        forwarded = dict(node.load.forwarded)
        unknown = 0
        for peer_id, count in forwarded.items():
            if peer_id not in by_id:
                unknown += count
        for peer_id, name in sorted(by_id.items(), key=lambda kv: kv[1]):
            m.add_metric([name], forwarded.get(peer_id, 0))
        if unknown:
            m.add_metric(["other"], unknown)
        yield m
        up = GaugeMetricFamily("hubpool_peer_up", "1 when the paired peer is connected, else 0", labels=["peer"])
        strikes = GaugeMetricFamily("hubpool_peer_consecutive_failures", "Health probes of the peer failed in a row",
                                    labels=["peer"])
        probe = GaugeMetricFamily("hubpool_peer_probe_failure", "1 when the peer's last health probe failed with "
                                  "this kind, else 0", labels=["peer", "kind"])
        failures = dict(node.health.failures)
        for p in sorted(peers, key=lambda p: p.node_fqdn):
            up.add_metric([p.node_fqdn], 1 if p.status == "connected" else 0)
            strikes.add_metric([p.node_fqdn], p.consecutive_failures or 0)
            current = failures.get(p.id)
            for kind in PROBE_KINDS:
                probe.add_metric([p.node_fqdn, kind], 1 if current is not None and current.kind == kind else 0)
        yield up
        yield strikes
        yield probe
        m = GaugeMetricFamily("hubpool_withheld_engines", "(node, engine, model) entries withheld from routing now",
                              labels=["kind"])
        m.add_metric(["output"], len(node.output_quarantine.snapshot()))
        m.add_metric(["unservable"], len(node.unservable.snapshot()))
        yield m
        ring = node.routing_log
        rows, total = len(ring.rows), ring.total_recorded
        yield CounterMetricFamily("hubpool_routing_log_evictions", "Routing-log rows dropped from the bounded ring",
                                  value=max(0, total - rows))
        yield GaugeMetricFamily("hubpool_routing_log_rows", "Rows the routing log holds now", value=rows)
        admission = getattr(node, "admission", None)
        if admission is not None:  # the admission queue (poolAdmissionQueue)
            state = admission.status()
            m = GaugeMetricFamily("hubpool_admission_queued", "Requests waiting in the admission queue now",
                                  labels=["class"])
            m.add_metric(["interactive"], state["interactive"])
            m.add_metric(["batch"], state["batch"])
            yield m
            left = CounterMetricFamily("hubpool_admission", "Requests leaving the admission queue, by how",
                                       labels=["outcome"])
            for outcome in ("dispatched", "overflowed", "expired", "abandoned"):
                left.add_metric([outcome], state[outcome])
            yield left
            yield CounterMetricFamily("hubpool_admission_wait_seconds", "Time dispatched requests waited, in all",
                                      value=admission.wait_ms_total / 1000)
        m = GaugeMetricFamily("hubpool_build_info", "This build of hubpool (always 1)", labels=["version"])
        m.add_metric([__version__], 1)
        yield m

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _Observer:
    """The in-process ``hubpool_request_finished`` observer feeding one node's metrics."""

    def __init__(self, metrics: NodeMetrics):
        self.metrics = metrics

    @hookimpl
    def hubpool_request_finished(self, row: dict[str, Any]) -> None:
        self.metrics.observe(row)


def install(node: Any) -> NodeMetrics:
    """The node's metrics, created and registered as an observer on first call (idempotent)."""
    manager = node.plugins.manager
    for name in (PLUGIN_NAME, "hubpool-core-" + PLUGIN_NAME):
        existing = manager.get_plugin(name)
        if isinstance(existing, _Observer) and existing.metrics.node is node:
            return existing.metrics
        if existing is None:
            metrics = NodeMetrics(node)
            manager.register(_Observer(metrics), name=name)
            return metrics
    # never fatal to the node: the gauges still work, the counters stay at zero
    log.warning("plugins named %s and hubpool-core-%s are installed: request counters are off", PLUGIN_NAME,
                PLUGIN_NAME)
    return NodeMetrics(node)
