"""The Hub Pool page's charts (issue 19, item 5): routing-log rows folded into per-minute
series, the route that serves them, and the settings form's words. The browser half is
tests/web/test_charts.py."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest
from harness import RunningNode
from hypothesis import given, settings
from hypothesis import strategies as st

from hubpool_core.config import PoolSettings
from hubpool_core.telemetry.charts import chart_series, percentile
from hubpool_core.web.routes import settings_schema
from hubpool_core.web.setting_words import SETTING_WORDS
from hubpool_sim import SimConfig, SimModel, run_in_thread

P = "/api/inference/pool"
NOW = 1_800_000_030.0  # 30 s into a minute
START = NOW - 30 - 3540  # the first bucket of the hour ending with NOW's minute


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def row(at: float, node: str | None = "local", outcome: str = "served", duration: int | None = 100,
        total: int | None = 1000, status: int | None = 200, failed_over=(), attempts=(), direction="outbound",
        reason=None):
    return {"at": iso(at), "direction": direction, "node": node, "outcome": outcome, "durationMs": duration,
            "totalMs": total, "status": status, "failedOverFrom": list(failed_over), "attempts": list(attempts),
            "reason": reason}


def test_an_empty_log_gives_sixty_empty_minutes():
    d = chart_series([], NOW)
    assert len(d["buckets"]) == 60 and d["bucketSeconds"] == 60
    assert d["buckets"][-1] <= NOW < d["buckets"][-1] + 60
    assert d["nodes"] == [] and d["failovers"] == [0] * 60 and d["reasons"] == [] and d["rows"] == 0


def test_requests_ttfb_queue_and_failovers_per_node():
    last = NOW - 30  # the start of the last bucket
    rows = [
        row(last + 1, duration=100, total=2500), row(last + 2, duration=300), row(last + 3, duration=200),
        row(last + 4, node="hub-b.ts.net", duration=50, total=20_000),
        # refused with a 4xx: counted as a request, never as a first byte
        row(last + 5, outcome="failed", duration=5, status=400),
        row(last + 6, failed_over=["hub-b.ts.net"],
            attempts=[{"node": "hub-b.ts.net", "backend": "vllm", "status": 503, "reason": "HTTP 503"}]),
        row(last + 7, node=None, outcome="failed", duration=None, status=502, reason="no candidate"),
        row(last + 8, direction="inbound", node="hub-c.ts.net"),  # a peer's request: its page counts it
        row(START - 600),  # before the window
    ]
    d = chart_series(rows, NOW)
    assert d["nodes"] == ["local", "hub-b.ts.net"]  # this node first
    assert d["requests"]["local"][-1] == 4 and d["requests"]["hub-b.ts.net"][-1] == 1
    assert d["ttfbP50"]["local"][-1] == 100 and d["ttfbP95"]["local"][-1] == 300  # [100,100,200,300]
    assert d["ttfbP50"]["local"][-2] is None
    assert d["failovers"][-1] == 1 and d["failures"][-1] == 2
    assert {"reason": "HTTP 503", "count": 1, "nodes": ["hub-b.ts.net"]} in d["reasons"]
    assert {"reason": "no candidate", "count": 1, "nodes": []} in d["reasons"]
    # local: [1, 3.5] overlaps [2, 3] and [3, 4]; those two are back to back (an end before a start)
    assert d["queueDepth"]["local"][-1] == 2
    assert d["queueDepth"]["hub-b.ts.net"][-1] == 1
    assert d["rows"] == 7 and d["oldestRow"] == iso(START - 600)


def test_a_long_request_counts_in_flight_in_every_minute_it_spans():
    rows = [row(START + 10, total=185_000)]  # three minutes and a bit
    depth = chart_series(rows, NOW)["queueDepth"]["local"]
    assert depth[:4] == [1, 1, 1, 1] and depth[4] == 0
    # still streaming (no totalMs yet): in flight up to now
    open_row = row(NOW - 200, outcome="pending", total=None, duration=None, status=None)
    depth = chart_series([open_row], NOW)["queueDepth"]["local"]
    assert depth[-4:] == [1, 1, 1, 1] and depth[-5] == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 3599), st.integers(0, 300_000), st.sampled_from(["local", "b", "c"])),
                max_size=60))
def test_series_are_consistent_with_the_rows(specs):
    rows = [row(START + at, node=node, total=total, duration=min(total, 500)) for at, total, node in specs]
    d = chart_series(rows, NOW)
    assert sum(sum(v) for v in d["requests"].values()) == len(rows)
    for node in d["nodes"]:
        for i, n in enumerate(d["requests"][node]):
            # a minute with requests starting in it had at least one in flight; p50 never above p95
            assert n == 0 or d["queueDepth"][node][i] >= 1
            p50, p95 = d["ttfbP50"][node][i], d["ttfbP95"][node][i]
            assert (p50 is None) == (n == 0) and (p50 is None or p50 <= p95)
        assert max(d["queueDepth"][node], default=0) <= sum(1 for r in rows if r["node"] == node)


def test_percentile_is_a_measured_value():
    assert percentile([1, 2, 3, 4], 50) == 2 and percentile([1, 2, 3, 4], 95) == 4 and percentile([7], 95) == 7


# -- the route, on a real node --------------------------------------------------------------

@pytest.fixture
def node(tmp_path):
    with run_in_thread(SimConfig(flavor="ollama", models=[SimModel("llama3.2:3b")])) as sim:
        with RunningNode(tmp_path / "n", {"OLLAMA_URL": sim.url}) as n:
            yield n, sim


def test_the_charts_route_folds_the_ring_and_refuses_the_day_without_history(node):
    n, sim = node
    for _ in range(3):
        r = httpx.post(n.url + "/v1/chat/completions", json={"model": "llama3.2:3b", "messages": [
            {"role": "user", "content": "hi"}]}, timeout=30)
        assert r.status_code == 200, r.text
    with n.client() as c:
        assert c.get(P + "/routing-log/charts").status_code == 401  # operator only, like the log itself
    with n.client(headers=n.headers()) as c:
        d = c.get(P + "/routing-log/charts").json()
        assert d["source"] == "ring" and d["window"] == "hour" and d["complete"] is True
        assert d["nodes"] == ["local"] and sum(d["requests"]["local"]) == 3
        assert max(d["queueDepth"]["local"]) >= 1 and any(v is not None for v in d["ttfbP50"]["local"])
        assert d["historyAvailable"] is False
        r = c.get(P + "/routing-log/charts", params={"window": "day"})
        assert r.status_code == 409 and "HUB_POOL_HISTORY" in r.json()["error"]
        r = c.get(P + "/routing-log/charts", params={"window": "week"})
        assert r.status_code == 400 and "hour, day" in r.json()["error"]


def test_the_day_window_reads_a_history_source_when_the_node_has_one(node):
    """The seam the persisted history plugs into: node.routing_history.rows_since(datetime)."""
    n, _ = node
    asked = []

    class History:
        def rows_since(self, since):
            asked.append(since)
            return [row(since.timestamp() + 60, node="hub-b.ts.net")]

    n.node.routing_history = History()
    with n.client(headers=n.headers()) as c:
        d = c.get(P + "/routing-log/charts", params={"window": "day"}).json()
    assert d["source"] == "history" and d["bucketSeconds"] == 900 and len(d["buckets"]) == 96
    assert sum(d["requests"]["hub-b.ts.net"]) == 1 and d["historyAvailable"] is True
    assert asked[0].timestamp() == d["buckets"][0]  # asked from the window's first bucket


# -- the settings form's words --------------------------------------------------------------

def test_every_setting_has_words():
    missing = set(PoolSettings.model_fields) - set(SETTING_WORDS)
    assert not missing, f"settings without a label and help in hubpool_core/web/setting_words.py: {sorted(missing)}"
    assert not set(SETTING_WORDS) - set(PoolSettings.model_fields), "words for a setting that no longer exists"
    for key, (label, words) in SETTING_WORDS.items():
        assert label and words and key not in label, f"{key}: a label in words and its help, not the key"
        assert words.endswith("."), f"{key}: the help is a sentence"


def test_the_form_schema_carries_the_words():
    schema = settings_schema()
    assert schema and all(f["label"] == SETTING_WORDS[f["key"]][0] and f["words"] for f in schema)
