"""GET /metrics: Prometheus series fed by the request-finished broadcast and read from the
node at scrape time; who may read them; and that no prompt or session key ever shows."""

from __future__ import annotations

import time
from contextlib import ExitStack
from types import SimpleNamespace

import httpx
import pytest
from harness import fqdn, make_pool, pair
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from hubpool_core.placement.quarantine import Quarantine
from hubpool_core.telemetry.metrics import BUCKETS, REASON_KINDS, NodeMetrics, reason_kind
from hubpool_core.telemetry.routing_log import RoutingLog
from hubpool_sim import SimConfig, SimModel, run_in_thread

P = "/api/inference/pool"
MARKER = "zebra-quokka-7731"  # in every prompt; must never reach a scrape
SESSION = "sess-marmot-4412"  # the X-Hub-Pool-Session value; same
MODEL = "llama3.2:3b"


def op(node, method, path, body=None, expect=200):
    with node.client(headers=node.headers()) as c:
        r = c.request(method, P + path, json=body)
    assert expect is None or r.status_code == expect, (r.status_code, r.text)
    return r.json()


def poll_all(nodes):
    for n in nodes.values():
        if n.thread.is_alive():
            n.run(n.node.health.poll_once())


def ask(node, route, model, **extra):
    if route == "/v1/chat/completions":
        body = {"model": model, "messages": [{"role": "user", "content": f"tell me about {MARKER}"}], **extra}
    else:
        body = {"model": model, "messages": [{"role": "user", "content": f"hello {MARKER}"}], "stream": False,
                **extra}
    return httpx.post(node.url + route, json=body, headers={"X-Hub-Pool-Session": SESSION}, timeout=60)


def scrape(node, headers=None, expect=200):
    r = httpx.get(node.url + "/metrics", headers=headers or {}, timeout=30, trust_env=False)
    assert r.status_code == expect, (r.status_code, r.text)
    return r


def samples(text):
    """{(sample name, sorted label items): value}, parsed the way Prometheus would."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def families(text):
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def value(parsed, name, /, **labels):
    return parsed.get((name, tuple(sorted(labels.items()))))


def settled(hub, name, want, /, **labels):
    """Scrape until a counter reaches ``want`` (the broadcast runs just after the last byte)."""
    deadline = time.monotonic() + 10
    while True:
        parsed = samples(scrape(hub).text)
        if value(parsed, name, **labels) == want or time.monotonic() > deadline:
            return parsed
        time.sleep(0.05)


@pytest.fixture
def pool(tmp_path):
    """hub-a (Ollama: llama3.2:3b) and hub-b (vLLM: llama3.2:3b), paired with a PIN."""
    with ExitStack() as stack:
        sims = {
            "hub-a": stack.enter_context(run_in_thread(SimConfig(flavor="ollama", models=[SimModel(MODEL)],
                                                                 decode_ms_per_token=0))),
            "hub-b": stack.enter_context(run_in_thread(SimConfig(flavor="vllm", models=[SimModel(MODEL)],
                                                                 decode_ms_per_token=0))),
        }
        engines = {name: {("VLLM_URL" if name == "hub-b" else "OLLAMA_URL"): sim.url} for name, sim in sims.items()}
        nodes = make_pool(tmp_path, list(sims), per_node=engines)
        for n in nodes.values():
            n.start()
        a, b = nodes["hub-a"], nodes["hub-b"]
        pair(a, b)
        poll_all(nodes)
        poll_all(nodes)  # a second round: the pairing now signs both ways
        yield nodes, sims
        for n in nodes.values():
            if n.thread.is_alive():
                n.stop()


def test_routed_requests_failover_and_502_are_counted_once_with_no_prompt_in_the_output(pool):
    nodes, sims = pool
    a, b = nodes["hub-a"], nodes["hub-b"]
    B, A = fqdn("hub-b"), fqdn("hub-a")

    r = ask(a, "/api/chat", MODEL)
    assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] == "local", r.text
    r = ask(a, "/v1/chat/completions", MODEL, stream=True)
    assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] == "local", r.text
    op(a, "POST", "/pins", {"scope": "model", "model": MODEL, "targetKind": "peer",
                            "targetPeerId": a.node.peers.by_fqdn(B).id})
    sims["hub-b"].add_fault("error:503", count=1)
    r = ask(a, "/api/chat", MODEL)  # hub-b's engine answers 503 once: failover to local
    assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] == "local", r.text
    r = ask(a, "/api/chat", MODEL)  # the pin, with nothing failing: hub-b serves it
    assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] == B, r.text
    r = ask(a, "/api/chat", f"nobody-has-{MARKER}")
    assert r.status_code == 502, r.text

    req = "hubpool_requests_total"
    pa = settled(a, req, 1, route="/api/chat", direction="outbound", outcome="failed", node="none")
    assert value(pa, req, route="/api/chat", direction="outbound", outcome="served", node="local") == 2
    assert value(pa, req, route="/v1/chat/completions", direction="outbound", outcome="served", node="local") == 1
    assert value(pa, req, route="/api/chat", direction="outbound", outcome="served", node=B) == 1
    assert sum(v for (name, _), v in pa.items() if name == req) == 5  # each request once
    assert value(pa, "hubpool_failovers_total", reason_kind="http_5xx") == 1
    assert sum(v for (name, _), v in pa.items() if name == "hubpool_failovers_total") == 1
    assert {dict(lbl)["reason_kind"] for (name, lbl) in pa if name == "hubpool_failovers_total"} == set(REASON_KINDS)
    for hist in ("hubpool_time_to_headers_seconds", "hubpool_request_duration_seconds"):
        assert value(pa, hist + "_count", route="/api/chat", direction="outbound") == 4
        assert value(pa, hist + "_count", route="/v1/chat/completions", direction="outbound") == 1
        assert value(pa, hist + "_bucket", route="/api/chat", direction="outbound", le="+Inf") == 4
        assert value(pa, hist + "_sum", route="/api/chat", direction="outbound") >= 0
    assert value(pa, "hubpool_in_flight", target="local") == 0
    assert value(pa, "hubpool_in_flight", target=B) == 0
    assert value(pa, "hubpool_peer_up", peer=B) == 1
    assert value(pa, "hubpool_peer_consecutive_failures", peer=B) == 0
    for kind in ("unreachable", "unauthorized", "identity_changed"):
        assert value(pa, "hubpool_peer_probe_failure", peer=B, kind=kind) == 0
    assert value(pa, "hubpool_withheld_engines", kind="output") == 0
    assert value(pa, "hubpool_withheld_engines", kind="unservable") == 0
    assert value(pa, "hubpool_routing_log_rows") == 5
    assert value(pa, "hubpool_routing_log_evictions_total") == 0
    assert value(pa, "hubpool_build_info", version="0.1.0") == 1

    # hub-b saw the two forwards: the 503 its engine gave (relayed back, marked) and the answer
    pb = settled(b, req, 1, route="/api/chat", direction="inbound", outcome="served", node=A)
    assert value(pb, req, route="/api/chat", direction="inbound", outcome="failed", node=A) == 1
    assert sum(v for (name, _), v in pb.items() if name == req) == 2
    assert sum(v for (name, _), v in pb.items() if name == "hubpool_failovers_total") == 0
    assert value(pb, "hubpool_peer_up", peer=A) == 1

    # Prometheus naming: counters end in _total, units as suffixes, every name snake_case
    types = families(scrape(a).text)
    assert types == {
        "hubpool_requests": "counter", "hubpool_failovers": "counter", "hubpool_stream_resumes": "counter",
        "hubpool_time_to_headers_seconds": "histogram", "hubpool_request_duration_seconds": "histogram",
        "hubpool_in_flight": "gauge", "hubpool_peer_up": "gauge", "hubpool_peer_consecutive_failures": "gauge",
        "hubpool_peer_probe_failure": "gauge", "hubpool_withheld_engines": "gauge",
        "hubpool_routing_log_evictions": "counter", "hubpool_routing_log_rows": "gauge", "hubpool_build_info": "gauge",
        "hubpool_admission": "counter", "hubpool_admission_queued": "gauge",
        "hubpool_admission_wait_seconds": "counter",
    }

    # readable from loopback without a key, and with a qa:read key; the same numbers both ways
    _row, qa_key = a.node.keys.create("qa", "qa:read")
    loopback, keyed = scrape(a), scrape(a, {"Authorization": f"Bearer {qa_key}"})
    assert loopback.headers["content-type"].startswith("text/plain; version=0.0.4")
    for r in (loopback, keyed, scrape(a, a.headers()), scrape(b)):
        assert MARKER not in r.text and SESSION not in r.text and "nobody-has" not in r.text
        samples(r.text)  # parses
    assert samples(keyed.text)[(req, tuple(sorted({"route": "/api/chat", "direction": "outbound",
                                                     "outcome": "served", "node": "local"}.items())))] == 2


def test_who_may_read_the_metrics(pool):
    nodes, _ = pool
    a = nodes["hub-a"]
    _row, qa_key = a.node.keys.create("qa", "qa:read")
    _row, inference_key = a.node.keys.create("app", "inference")
    proxied = {"cf-ray": "8a1b2c3d4e5f-AMS"}
    assert scrape(a, proxied, expect=401).json()["code"] == "AUTH_ERROR_MISSING_CREDENTIAL"
    scrape(a, {"X-Forwarded-For": "203.0.113.9"}, expect=401)  # a local proxy forwarding someone else
    scrape(a, {**proxied, "Authorization": f"Bearer {qa_key}"})
    scrape(a, {**proxied, **a.headers()})
    assert scrape(a, {"Authorization": "Bearer not-a-key"}, expect=401).json()["code"] == \
        "AUTH_ERROR_INVALID_CREDENTIAL"
    assert scrape(a, {"Authorization": f"Bearer {inference_key}"}, expect=403).json()["code"] == "AUTH_ERROR_SCOPE"
    scrape(a, {"X-Forwarded-For": "127.0.0.1"})
    # the qa:read allowance is this route's own: other operator routes are unchanged for it
    with a.client(headers={"Authorization": f"Bearer {qa_key}"}) as c:
        assert c.get(P + "/settings").status_code == 403


def test_peer_health_series_follow_the_poller(pool):
    nodes, _ = pool
    a, b = nodes["hub-a"], nodes["hub-b"]
    B = fqdn("hub-b")
    b.stop()
    a.run(a.node.health.poll_once())
    parsed = samples(scrape(a).text)
    assert value(parsed, "hubpool_peer_probe_failure", peer=B, kind="unreachable") == 1
    assert value(parsed, "hubpool_peer_probe_failure", peer=B, kind="unauthorized") == 0
    assert value(parsed, "hubpool_peer_consecutive_failures", peer=B) == 1
    assert value(parsed, "hubpool_peer_up", peer=B) == 1  # three strikes make it unreachable
    a.run(a.node.health.poll_once())
    a.run(a.node.health.poll_once())
    parsed = samples(scrape(a).text)
    assert value(parsed, "hubpool_peer_up", peer=B) == 0
    assert value(parsed, "hubpool_peer_consecutive_failures", peer=B) == 3


# -- the collector on its own ---------------------------------------------------------------

def _stub_node():
    return SimpleNamespace(
        peers=SimpleNamespace(all=lambda: []), health=SimpleNamespace(failures={}),
        load=SimpleNamespace(local=0, forwarded={}), output_quarantine=Quarantine(), unservable=Quarantine(),
        routing_log=RoutingLog())


def test_a_row_is_counted_once_and_a_pending_row_not_at_all():
    node = _stub_node()
    metrics = NodeMetrics(node)
    row = node.routing_log.open(direction="outbound", path="/api/chat", model="m")
    assert metrics.observe(row) is False  # pending
    node.routing_log.touch(row, outcome="served", node="local", status=200, durationMs=12, totalMs=40)
    assert metrics.observe(row) is True
    assert metrics.observe(row) is False  # broadcast again: still one request
    parsed = samples(metrics.exposition().decode())
    assert value(parsed, "hubpool_requests_total", route="/api/chat", direction="outbound", outcome="served",
                 node="local") == 1
    assert value(parsed, "hubpool_time_to_headers_seconds_bucket", route="/api/chat", direction="outbound",
                 le="0.01") == 0
    assert value(parsed, "hubpool_time_to_headers_seconds_bucket", route="/api/chat", direction="outbound",
                 le="0.025") == 1
    assert value(parsed, "hubpool_request_duration_seconds_sum", route="/api/chat", direction="outbound") == 0.04


def test_evictions_and_withheld_engines_are_read_at_scrape_time():
    node = _stub_node()
    metrics = NodeMetrics(node)
    for _ in range(node.routing_log.capacity + 7):
        node.routing_log.open(direction="outbound", path="/api/chat", model="m")
    for key in (("local", "engine-x", "m"), ("local", "engine-x", "m")):
        node.unservable.strike(key, "HTTP 503")
    parsed = samples(metrics.exposition().decode())
    assert value(parsed, "hubpool_routing_log_evictions_total") == 7
    assert value(parsed, "hubpool_routing_log_rows") == node.routing_log.capacity
    assert value(parsed, "hubpool_withheld_engines", kind="unservable") == 1
    assert value(parsed, "hubpool_withheld_engines", kind="output") == 0


@pytest.mark.parametrize(("attempt", "kind"), [
    ({"status": 503, "reason": "HTTP 503"}, "http_5xx"),
    ({"status": 429, "reason": "HTTP 429"}, "http_4xx"),
    ({"status": None, "reason": "No response headers within 1500ms"}, "deadline"),
    ({"status": None, "reason": "fetch failed (ECONNREFUSED)"}, "transport"),
    ({"status": 200, "reason": "truncated-upstream (ClientPayloadError)"}, "transport"),
    ({"status": 200, "reason": "truncated-upstream"}, "output_fault"),
    ({"status": 200, "reason": "degenerate-output"}, "output_fault"),
    ({"status": 500, "reason": "HTTP 500 (context-length)"}, "verdict"),
    ({"status": None, "reason": "This node has no usable pool identity"}, "other"),
])
def test_reason_kinds(attempt, kind):
    assert reason_kind(attempt) == kind


def test_the_route_label_set_is_the_routed_set():
    from hubpool_core.api.inference import ROUTED
    from hubpool_core.telemetry.metrics import ROUTES

    assert ROUTES == set(ROUTED)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.floats(min_value=0, max_value=1000, allow_nan=False),
                          st.sampled_from(list(BUCKETS))), max_size=50))
def test_histogram_buckets_are_cumulative_counts_of_values_at_or_below_each_bound(values):
    from hubpool_core.telemetry.metrics import _Histogram

    h = _Histogram()
    for v in values:
        h.observe(v)
    expected = [(floatToGoString(b), float(sum(1 for v in values if v <= b))) for b in BUCKETS]
    assert h.buckets() == expected + [("+Inf", float(len(values)))]
    assert h.sum == sum(values)
