"""OpenTelemetry traces through real nodes: a span per routed request with a child per
attempt, the trace carried to the peer that serves a forward, spans exported to a real
OTLP/HTTP collector on loopback with no prompt in any byte; off and free by default, and a
node that asks for traces without the SDK installed still serves (docs/tracing.md)."""

from __future__ import annotations

import builtins
import gzip
import logging
import os
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from harness import ENGINE_VARS, RunningNode, closed_port_url, fqdn, make_pool, pair
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status as PbStatus

from hubpool_core.telemetry import tracing
from hubpool_sim import SimConfig, SimModel, run_in_thread

MODEL = "llama3.2:3b"
MARKER = "pangolin-tracer-5519"  # in every prompt; must never reach the collector
SESSION = "sess-okapi-2207"  # the X-Hub-Pool-Session value; same
SERVER, CLIENT = PbSpan.SpanKind.SPAN_KIND_SERVER, PbSpan.SpanKind.SPAN_KIND_CLIENT
ERROR = PbStatus.StatusCode.STATUS_CODE_ERROR
SDK_MODULES = ("opentelemetry.sdk", "opentelemetry.exporter")


# -- a small OTLP/HTTP collector ------------------------------------------------------------

def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def _attrs(key_values: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in key_values}


@dataclass
class Span:
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str
    start: int
    end: int
    attrs: dict[str, Any]
    status: int
    message: str
    resource: dict[str, Any]


class Collector:
    """Accepts POST /v1/traces as an OpenTelemetry collector does, and keeps the raw bytes
    and the decoded spans."""

    def __init__(self) -> None:
        self.raw: list[bytes] = []
        self.spans: list[Span] = []
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                collector.receive(body)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def receive(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        spans = []
        for rs in request.resource_spans:
            resource = _attrs(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans.append(Span(s.name, s.kind, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
                                      s.start_time_unix_nano, s.end_time_unix_nano, _attrs(s.attributes),
                                      s.status.code, s.status.message, resource))
        with self.lock:
            self.raw.append(body)
            self.spans.extend(spans)

    def wait_for(self, predicate: Any, timeout: float = 15) -> list[Span]:
        """The spans received so far, once ``predicate(spans)`` holds."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                spans = list(self.spans)
            if predicate(spans):
                return spans
            assert time.monotonic() < deadline, f"the collector has {[(s.name, s.attrs) for s in spans]}"
            time.sleep(0.05)

    def __enter__(self) -> Collector:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def request_spans(rid: str, name_prefix: str) -> Any:
    """A function of the spans received: those named ``name_prefix...`` for request ``rid``."""
    return lambda spans: [s for s in spans
                          if s.name.startswith(name_prefix) and s.attrs.get("hubpool.request_id") == rid]


def children(spans: list[Span], parent: Span) -> list[Span]:
    return sorted((s for s in spans if s.parent_id == parent.span_id and s.trace_id == parent.trace_id),
                  key=lambda s: s.attrs.get("hubpool.attempt", 0))


def poll_all(nodes: dict[str, RunningNode]) -> None:
    for n in nodes.values():
        n.run(n.node.health.poll_once())


@pytest.fixture
def traced_pool(tmp_path):
    """hub-a (Ollama) and hub-b (vLLM), both holding llama3.2:3b, paired, exporting to a
    collector on loopback."""
    with ExitStack() as stack:
        collector = stack.enter_context(Collector())
        sims = {
            "hub-a": stack.enter_context(run_in_thread(SimConfig(flavor="ollama", models=[SimModel(MODEL)],
                                                                 decode_ms_per_token=0))),
            "hub-b": stack.enter_context(run_in_thread(SimConfig(flavor="vllm", models=[SimModel(MODEL)],
                                                                 decode_ms_per_token=0))),
        }
        otel = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.url + "/v1/traces",
                "OTEL_BSP_SCHEDULE_DELAY": "50"}
        engines = {name: {("VLLM_URL" if name == "hub-b" else "OLLAMA_URL"): sim.url} for name, sim in sims.items()}
        nodes = make_pool(tmp_path, list(sims), environ=otel, per_node=engines)
        for n in nodes.values():
            n.start()
        pair(nodes["hub-a"], nodes["hub-b"])
        poll_all(nodes)
        poll_all(nodes)  # a second round: the pairing now signs both ways
        yield nodes, sims, collector
        for n in nodes.values():
            if n.thread.is_alive():
                n.stop()


def test_a_failover_to_a_peer_is_one_trace_across_both_nodes_with_no_prompt_in_it(traced_pool):
    nodes, sims, collector = traced_pool
    a, b = nodes["hub-a"], nodes["hub-b"]
    A, B = fqdn("hub-a"), fqdn("hub-b")
    assert a.node.tracer is not None and b.node.tracer is not None
    sims["hub-a"].add_fault("error:503", count=1)  # the local engine fails first: hub-b serves
    r = httpx.post(a.url + "/v1/chat/completions", timeout=60, headers={"X-Hub-Pool-Session": SESSION},
                   json={"model": MODEL, "messages": [{"role": "user", "content": f"tell me about {MARKER}"}]})
    assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] == B, r.text
    rid = r.headers["x-hub-pool-request-id"]

    spans = collector.wait_for(lambda s: request_spans(rid, "hubpool route")(s)
                               and request_spans(rid, "hubpool forward")(s) and len(s) >= 5)
    [route] = request_spans(rid, "hubpool route")(spans)
    assert route.name == "hubpool route /v1/chat/completions" and route.kind == SERVER and route.parent_id == ""
    assert route.attrs == {"hubpool.request_id": rid, "hubpool.route": "/v1/chat/completions",
                           "gen_ai.request.model": MODEL, "hubpool.candidates": 2, "hubpool.outcome": "served",
                           "http.response.status_code": 200, "hubpool.node": B, "hubpool.failed_over_from": ["local"]}
    assert route.status != ERROR
    assert route.resource["service.name"] == "hubpool" and route.resource["service.instance.id"] == A

    first, second = children(spans, route)
    assert (first.name, first.kind, second.name, second.kind) == ("hubpool attempt", CLIENT, "hubpool attempt", CLIENT)
    assert first.attrs == {"hubpool.node": "local", "hubpool.backend": "ollama", "hubpool.attempt": 1,
                           "http.response.status_code": 503, "hubpool.reason": "HTTP 503"}
    assert first.status == ERROR and first.message == "HTTP 503"
    assert second.attrs == {"hubpool.node": B, "hubpool.backend": "vllm", "hubpool.attempt": 2,
                            "http.response.status_code": 200}
    assert second.status != ERROR
    assert route.start <= first.start <= first.end <= second.start <= second.end <= route.end

    # the serving peer continues the trace under the attempt that reached it
    [forward] = request_spans(rid, "hubpool forward")(spans)
    assert forward.name == "hubpool forward /v1/chat/completions" and forward.kind == SERVER
    assert forward.trace_id == route.trace_id and forward.parent_id == second.span_id
    assert forward.attrs == {"hubpool.request_id": rid, "hubpool.route": "/v1/chat/completions",
                             "gen_ai.request.model": MODEL, "hubpool.peer": A, "hubpool.outcome": "served",
                             "http.response.status_code": 200}
    assert forward.resource["service.instance.id"] == B
    [engine] = children(spans, forward)
    assert engine.kind == CLIENT and engine.attrs == {"hubpool.node": "local", "hubpool.backend": "vllm",
                                                      "hubpool.attempt": 1, "http.response.status_code": 200}

    # a verdict: the engine's 500 goes back as a 400, and the route span says what the app got
    sims["hub-a"].add_fault("verdict:no-user-query", count=1)
    r = httpx.post(a.url + "/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "messages": [{"role": "user", "content": MARKER}]})
    assert r.status_code == 400, r.text
    rid = r.headers["x-hub-pool-request-id"]
    [verdict] = request_spans(rid, "hubpool route")(collector.wait_for(request_spans(rid, "hubpool route")))
    assert verdict.attrs["http.response.status_code"] == 400 and verdict.attrs["hubpool.outcome"] == "failed"
    assert verdict.status == ERROR and verdict.message == "HTTP 500 (no-user-query)"
    [engine_500] = children(collector.spans, verdict)
    assert engine_500.attrs["http.response.status_code"] == 500 and engine_500.status == ERROR

    # the early 502: nobody holds the model
    r = httpx.post(a.url + "/v1/chat/completions", timeout=60,
                   json={"model": "nobody-has-this:1b", "messages": [{"role": "user", "content": MARKER}]})
    assert r.status_code == 502
    rid = r.headers["x-hub-pool-request-id"]
    [none] = request_spans(rid, "hubpool route")(collector.wait_for(request_spans(rid, "hubpool route")))
    assert none.status == ERROR and none.message == "no candidate"
    assert none.attrs["hubpool.candidates"] == 0 and none.attrs["http.response.status_code"] == 502
    assert none.attrs["hubpool.outcome"] == "failed" and not children(collector.spans, none)

    for n in nodes.values():
        n.stop()  # flushes whatever is still batched
    raw = b"".join(collector.raw)
    for secret in (MARKER, SESSION, a.operator_key, b.operator_key):
        assert secret.encode() not in raw
    assert b"signature" not in raw.lower() and b"bearer" not in raw.lower()


def test_a_streamed_requests_span_ends_after_its_last_chunk(traced_pool):
    nodes, sims, collector = traced_pool
    a = nodes["hub-a"]
    delay_ms = 40
    sims["hub-a"].configure(decode_ms_per_token=delay_ms)
    arrivals: list[tuple[int, str]] = []
    with httpx.stream("POST", a.url + "/v1/chat/completions", timeout=60,
                      json={"model": MODEL, "stream": True,
                            "messages": [{"role": "user", "content": f"hello {MARKER}"}]}) as r:
        assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] == "local"
        rid = r.headers["x-hub-pool-request-id"]
        for line in r.iter_lines():
            if line.strip():
                arrivals.append((time.time_ns(), line))
    assert arrivals[-1][1] == "data: [DONE]"
    tokens = [t for t, line in arrivals if '"content"' in line and '"content": ""' not in line
              and '"content":""' not in line]
    assert len(tokens) >= 3, arrivals

    [route] = request_spans(rid, "hubpool route")(collector.wait_for(request_spans(rid, "hubpool route")))
    [attempt] = children(collector.spans, route)
    # the engine waits delay_ms before each token, and the last token, the final frame and
    # [DONE] leave together: the token before the last arrived a full delay before the end
    assert route.end > tokens[-2]
    assert route.end - route.start >= (len(tokens) - 1) * delay_ms * 1_000_000
    assert attempt.end <= route.end and attempt.end > tokens[-2]
    assert route.attrs["hubpool.outcome"] == "served" and route.attrs["http.response.status_code"] == 200


# -- off by default, console, and asked for but not installed --------------------------------

def _clean_environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}


@pytest.mark.parametrize("exporter", [None, "none"])
def test_a_node_without_traces_asked_for_imports_no_sdk(tmp_path, exporter):
    env = {**_clean_environ(), **{v: closed_port_url() for v in ENGINE_VARS},
           "HUB_POOL_DATA_DIR": str(tmp_path / "node"), "HUB_POOL_LISTEN": "127.0.0.1:9",
           "HUB_POOL_TAILSCALE_CLI": "/nonexistent/tailscale"}
    if exporter is not None:
        env["OTEL_TRACES_EXPORTER"] = exporter
    code = ("import asyncio, os, sys\n"
            "from hubpool_core.config import EnvSettings\n"
            "from hubpool_core.node.node import Node\n"
            "from hubpool_core.node.server import make_config\n"
            "env = EnvSettings.from_environ(os.environ)\n"
            "node = Node(env)\n"
            "make_config(env, node, 'warning').load()\n"
            "async def life():\n"
            "    await node.start()\n"
            "    assert node.tracer is None\n"
            "    await node.stop()\n"
            "asyncio.run(life())\n"
            f"print([m for m in sys.modules if m.startswith({SDK_MODULES!r})])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_console_exporter_prints_the_spans_and_the_node_serves(tmp_path, capsys):
    with run_in_thread(SimConfig(flavor="ollama", models=[SimModel(MODEL)], decode_ms_per_token=0)) as sim:
        node = RunningNode(tmp_path / "node", {"OLLAMA_URL": sim.url, "OTEL_TRACES_EXPORTER": "console",
                                               "OTEL_SERVICE_NAME": "hubpool-console-test"})
        with node:
            r = httpx.post(node.url + "/api/chat", timeout=60, json={
                "model": MODEL, "stream": False, "messages": [{"role": "user", "content": f"hi {MARKER}"}]})
            assert r.status_code == 200, r.text
            rid = r.headers["x-hub-pool-request-id"]
        out = capsys.readouterr().out  # stopping the node flushed the batch
    assert '"name": "hubpool route /api/chat"' in out and '"name": "hubpool attempt"' in out
    assert rid in out and "hubpool-console-test" in out
    assert MARKER not in out


def test_traces_asked_for_without_the_sdk_warn_once_and_the_node_serves(tmp_path, monkeypatch, caplog):
    real_import = builtins.__import__

    def without_sdk(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith(SDK_MODULES):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_sdk)
    caplog.set_level(logging.WARNING, logger="hubpool.tracing")
    with run_in_thread(SimConfig(flavor="ollama", models=[SimModel(MODEL)], decode_ms_per_token=0)) as sim:
        with RunningNode(tmp_path / "node", {"OLLAMA_URL": sim.url, "OTEL_TRACES_EXPORTER": "otlp"}) as node:
            for _ in range(2):
                r = httpx.post(node.url + "/api/chat", timeout=60, json={
                    "model": MODEL, "stream": False, "messages": [{"role": "user", "content": "hi"}]})
                assert r.status_code == 200, r.text
            assert node.node.tracer is None
    warnings = [rec.getMessage() for rec in caplog.records if rec.name == "hubpool.tracing"]
    assert len(warnings) == 1, warnings
    assert "uv sync --extra otel" in warnings[0] and "pip install 'hubpool[otel]'" in warnings[0]


def test_an_unknown_exporter_warns_once_and_traces_nothing(caplog):
    caplog.set_level(logging.WARNING, logger="hubpool.tracing")
    assert tracing.build({"OTEL_TRACES_EXPORTER": "jaeger"}) is None
    assert tracing.build({"OTEL_TRACES_EXPORTER": "none"}) is None
    assert tracing.build({}) is None
    assert [r.getMessage() for r in caplog.records if r.name == "hubpool.tracing"] == [
        "OTEL_TRACES_EXPORTER=jaeger: unknown exporter jaeger (hubpool supports otlp and console); "
        "serving without traces"]


def test_only_the_node_itself_is_configured_never_the_global_provider():
    from opentelemetry import trace

    before = trace.get_tracer_provider()
    tracer = tracing.build({"OTEL_TRACES_EXPORTER": "console"}, "node-x")
    try:
        assert tracer is not None and trace.get_tracer_provider() is before
        assert tracer.provider.resource.attributes["service.name"] == "hubpool"
        assert tracer.provider.resource.attributes["service.instance.id"] == "node-x"
    finally:
        tracer.provider.shutdown()
