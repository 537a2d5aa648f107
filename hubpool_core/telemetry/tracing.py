"""Optional OpenTelemetry traces: a span per routed request, a child per attempt, and the
trace carried to the peer that serves a forward (docs/tracing.md).

Off unless OTEL_TRACES_EXPORTER names an exporter, and free when off: this module imports
no OpenTelemetry code until a node asks for traces, ``Node.tracer`` stays None, and the
relay's only cost is one ``plan.span is not None`` check where a span would be touched.

Each node owns its TracerProvider (several nodes share one test process, so the global
provider is never set) and uses the W3C TraceContext propagator explicitly. No attribute
ever carries a prompt, a body, a header value or a key: only routes, model names, node
names, statuses and the routing log's reasons, which are prompt-free by design.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from hubpool_core import __version__
from hubpool_core.config import whole_in_range

log = logging.getLogger("hubpool.tracing")

EXPORTER_VAR = "OTEL_TRACES_EXPORTER"
EXPORTERS = ("otlp", "console")
DEFAULT_SERVICE_NAME = "hubpool"
INSTALL_HINT = "install it with `uv sync --extra otel` or `pip install 'hubpool[otel]'`"
#: how long start() waits for the tailnet to name this node before using the listen address
NAME_WAIT_S = 2.0
#: the BatchSpanProcessor's settings, read from the node's own environment (see build())
_BSP_VARS = {
    "OTEL_BSP_MAX_QUEUE_SIZE": "max_queue_size",
    "OTEL_BSP_SCHEDULE_DELAY": "schedule_delay_millis",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "max_export_batch_size",
    "OTEL_BSP_EXPORT_TIMEOUT": "export_timeout_millis",
}


def requested(environ: Mapping[str, str]) -> list[str]:
    """The exporters OTEL_TRACES_EXPORTER names (a comma-separated list); empty when it is
    unset or ``none``."""
    raw = (environ.get(EXPORTER_VAR) or "").strip().lower()
    names = [n.strip() for n in raw.split(",") if n.strip()]
    return [] if names in ([], ["none"]) else names


async def for_node(node: Any) -> NodeTracer | None:
    """The node's tracer when its environment asks for traces, else None. Never raises: a
    tracing problem is logged once and the node serves without traces."""
    environ = node.env.environ()
    if not requested(environ):
        return None
    try:
        return build(environ, await _instance_name(node))
    except Exception as exc:  # noqa: BLE001 - tracing must never stop a node
        log.warning("OpenTelemetry tracing could not start (%s); serving without traces", exc)
        return None


async def _instance_name(node: Any) -> str:
    """The node's tailnet name, else its listen address (service.instance.id)."""
    try:
        name = await asyncio.wait_for(node.tailnet.self_fqdn(), NAME_WAIT_S)
    except Exception:  # noqa: BLE001 - a name is a nicety
        name = None
    return name or node.env.listen


def build(environ: Mapping[str, str], instance: str | None = None) -> NodeTracer | None:
    """A tracer exporting as ``environ`` says, or None (with one warning saying why).

    The node's own environment mapping is read for the exporter choice, the service name,
    the OTLP endpoint and the batch processor's settings (a node run in a test thread has
    its own mapping); every other OTEL_* variable (headers, timeout, compression, TLS,
    OTEL_RESOURCE_ATTRIBUTES) is read by the SDK from the process environment."""
    names = requested(environ)
    if not names:
        return None
    unknown = [n for n in names if n not in EXPORTERS]
    if unknown:
        log.warning("%s=%s: unknown exporter %s (hubpool supports otlp and console); serving without traces",
                    EXPORTER_VAR, environ.get(EXPORTER_VAR), ", ".join(unknown))
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        if "otlp" in names:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        log.warning("%s=%s asks for traces, but the OpenTelemetry SDK or its OTLP exporter is not installed "
                    "(%s): %s; serving without traces", EXPORTER_VAR, environ.get(EXPORTER_VAR), exc, INSTALL_HINT)
        return None
    resource = Resource.create({"service.version": __version__,
                                **({"service.instance.id": instance} if instance else {})})
    service = (environ.get("OTEL_SERVICE_NAME") or "").strip()
    if service or str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": service or DEFAULT_SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    # BatchSpanProcessor's numeric keywords: Any, as mypy cannot match a **dict to them by name
    batch: dict[str, Any] = {arg: value for var, arg in _BSP_VARS.items()
                             if (value := whole_in_range(environ.get(var), 1, None)) is not None}
    for name in names:
        if name == "otlp":
            exporter: Any = OTLPSpanExporter(endpoint=_otlp_endpoint(environ))
        else:
            import sys

            exporter = ConsoleSpanExporter(out=sys.stdout)  # the stdout of now, not of import time
        provider.add_span_processor(BatchSpanProcessor(exporter, **batch))
    log.info("OpenTelemetry traces on: %s (service %s, instance %s)", ", ".join(names),
             resource.attributes.get("service.name"), instance)
    return NodeTracer(provider)


def _otlp_endpoint(environ: Mapping[str, str]) -> str | None:
    """The traces URL from the node's environment; None lets the exporter resolve it."""
    traces = (environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or "").strip()
    if traces:
        return traces
    base = (environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "").strip()
    return base.rstrip("/") + "/v1/traces" if base else None


class NodeTracer:
    """One node's tracer: its provider, the W3C propagator, and the shape of every span."""

    def __init__(self, provider: Any):  # noqa: D107
        from opentelemetry.context import Context
        from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self._tracer = provider.get_tracer("hubpool", __version__)
        self._propagator = TraceContextTextMapPropagator()
        self._root = Context()  # an app's request starts a trace; only a peer's continues one
        self._in = set_span_in_context
        self._server, self._client = SpanKind.SERVER, SpanKind.CLIENT
        self._status, self._error = Status, StatusCode.ERROR

    # -- the request's span ----------------------------------------------------------------
    def start_route(self, route: str, row: dict[str, Any], model: str, candidates: int, began_ns: int) -> Any:
        """The SERVER span of a request an app sent (it covers placement: ``began_ns``)."""
        return self._tracer.start_span(
            f"hubpool route {route}", context=self._root, kind=self._server, start_time=began_ns or None,
            attributes={"hubpool.request_id": row["id"], "hubpool.route": route, "gen_ai.request.model": model,
                        "hubpool.candidates": candidates})

    def start_forward(self, headers: Mapping[str, str], route: str, row: dict[str, Any], model: str,
                      peer: str, began_ns: int) -> Any:
        """The SERVER span of a forward the peer guard admitted, a child of the sender's
        attempt when its request carried a trace context."""
        try:
            parent = self._propagator.extract(headers)
        except Exception:  # noqa: BLE001 - a malformed context starts a new trace
            parent = self._root
        return self._tracer.start_span(
            f"hubpool forward {route}", context=parent, kind=self._server, start_time=began_ns or None,
            attributes={"hubpool.request_id": row["id"], "hubpool.route": route, "gen_ai.request.model": model,
                        "hubpool.peer": peer})

    def watch(self, span: Any, send: Any) -> Any:
        """``send``, noting on ``span`` the status the app (or the sending peer) is sent."""
        async def traced(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                span.set_attribute("http.response.status_code", message["status"])
            await send(message)

        return traced

    def end_request(self, span: Any, row: dict[str, Any], status: int | None = None) -> None:
        """End the request's span with what its routing-log row settled on."""
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        span.set_attribute("hubpool.outcome", row["outcome"])
        if row["direction"] == "outbound":  # an inbound row's node is the sender: hubpool.peer
            if row["node"]:
                span.set_attribute("hubpool.node", row["node"])
            if row["failedOverFrom"]:
                span.set_attribute("hubpool.failed_over_from", list(row["failedOverFrom"]))
        if row["outcome"] != "served":
            span.set_status(self._status(self._error, row["reason"] or "ended without an answer"))
        span.end()

    # -- one attempt -----------------------------------------------------------------------
    def start_attempt(self, parent: Any, cand: Any, attempt: int) -> Any:
        """The CLIENT span of one candidate tried (``attempt`` counts from 1)."""
        return self._tracer.start_span(
            "hubpool attempt", context=self._in(parent), kind=self._client,
            attributes={"hubpool.node": cand.node, "hubpool.backend": cand.backend, "hubpool.attempt": attempt})

    def inject(self, span: Any, headers: dict[str, str]) -> None:
        """Add the attempt's trace context (traceparent, tracestate) to a peer request's
        headers. They are not covered by the request's signature, and say nothing secret."""
        self._propagator.inject(headers, context=self._in(span))

    def end_attempt(self, span: Any, row: dict[str, Any], attempt: int) -> None:
        """End an attempt's span. The relay records every attempt it passed over in the row's
        ``attempts``; any other attempt is the one that ended the walk, told by the row itself."""
        passed = row["attempts"]
        if len(passed) >= attempt:
            entry = passed[attempt - 1]
            status, failed, reason = entry["status"], True, entry["reason"]
        else:
            status, failed = row["status"], row["outcome"] != "served"
            reason = row["reason"] or "ended without an answer"
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        if failed:
            span.set_attribute("hubpool.reason", reason)
            span.set_status(self._status(self._error, reason))
        span.end()

    async def shutdown(self) -> None:
        """Flush what is batched and stop the exporters (in a thread: an export blocks)."""
        try:
            await asyncio.to_thread(self.provider.shutdown)
        except Exception as exc:  # noqa: BLE001 - stopping must finish whatever the collector does
            log.warning("OpenTelemetry tracing did not shut down cleanly: %s", exc)
