"""Peer-facing /local/*: work a paired node forwards to this node's own engines.

These never re-run candidate selection (the no-relay rule): the sender already chose this
node and the engine, named in X-Hub-Pool-Backend. Every answer relayed from an engine is
stamped with X-Hub-Pool-Backend; this node's own refusals carry no stamp, which is how the
sender tells them apart. Every refusal is an inbound routing-log row too.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from hubpool_core.api.dialects import passed_headers
from hubpool_core.api.inference import ROUTED, BadRequest, _wants_stream, read_json_object
from hubpool_core.engine import RESPONSES
from hubpool_core.peering.guard import PeerRefused, admit
from hubpool_core.placement import PlacementRequest, place_inbound, snapshot_of
from hubpool_core.placement.slot_clock import FREE_HEADER
from hubpool_core.proxy import LOCAL_PREFIX, RelayPlan, RelayResponse, start_within
from hubpool_core.proxy.response_homes import RESPONSE_ID
from hubpool_core.signals.local_engines import listing_backends
from hubpool_core.telemetry.routing_log import RoutingLog

REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")
INBOUND_OFF = "This node is not accepting pooled work right now (inbound pooling is switched off here)"
PEER_OFF = "This node is not exchanging work with your node right now (the operator disabled this peer here)"
BAD_BACKEND = "Missing or invalid X-Hub-Pool-Backend header"


def refusal_row(log: RoutingLog, route: str, sender: str | None, headers: Mapping[str, str], status: int,
                message: str) -> dict[str, Any]:
    """The inbound row of a refusal, settled. ``sender`` None: no guard admitted the caller, so
    nothing it sent is trusted with a place among the decisions: the row goes to the log's
    ring of refusals under an id this node mints (the caller's X-Hub-Pool-Request-Id would
    let it replace a real row), and its model is cut as every string the log keeps."""
    model = headers.get("x-hub-pool-model")
    if sender is None:
        row = log.open_refusal(direction="inbound", path=route, model=model)
    else:
        rid = headers.get("x-hub-pool-request-id")
        row = log.open(direction="inbound", path=route, model=model,
                       request_id=rid if rid and REQUEST_ID.fullmatch(rid) else None)
    log.touch(row, node=sender, outcome="failed", status=status, reason=message[:200], durationMs=0, totalMs=0)
    return row


def _refuse(node: Any, route: str, sender: str | None, request: Request, status: int, message: str,
            headers: dict[str, str] | None = None) -> JSONResponse:
    row = refusal_row(node.routing_log, route, sender, request.headers, status, message)
    node.plugins.broadcast_request_finished(row)
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _busy(node: Any, route: str, sender: str, request: Request, cand: Any, allowed: int) -> JSONResponse | None:
    """The 429 that turns a forward back when this node's engine has no slot within the wait the
    sender allowed (proxy/start_within.py), with this node's count and schedule beside it; None
    when a slot frees in time or the slot clock cannot say."""
    slots = getattr(cand.local.snapshot.result, "slots", None)
    wait = start_within.wait_here(node.slot_clock, cand.backend, slots)
    if wait is None or wait <= allowed:
        return None
    # the count as on any answer to a forward: the forward itself included (the sender still
    # counts it as sent, and takes it off when it moves on)
    headers = {"X-Hub-Pool-Refusal": start_within.REFUSAL, "X-Hub-Pool-In-Flight": str(node.load.local + 1)}
    free = node.slot_clock.header_value(cand.backend, slots)
    if free is not None:
        headers[FREE_HEADER] = free
    return _refuse(node, route, sender, request, 429,
                   f"busy: this node's {cand.backend} has no free slot for about {round(wait)} ms, longer than the "
                   f"{allowed} ms the sender allowed; place the request elsewhere", headers)


def _admitted(node: Any, request: Request, route: str) -> tuple[Any, JSONResponse | None]:
    raw_path = (request.scope.get("raw_path") or request.url.path.encode()).decode("latin-1")
    try:
        row = admit(node, request.method, raw_path, request.headers.items(), None)
    except PeerRefused as exc:
        return None, _refuse(node, route, None, request, exc.status, exc.message, exc.headers)
    directions = node.directions()
    if not directions.master.enabled:
        return row, _refuse(node, route, row.node_fqdn, request, 503, directions.describe_master())
    if row.status not in ("connected", "unreachable"):
        return row, _refuse(node, route, row.node_fqdn, request, 403, "Peer is not connected")
    if not directions.inbound.enabled:
        # 503, never 403: a 403 would make the sender drop a healthy pairing's capabilities
        return row, _refuse(node, route, row.node_fqdn, request, 503, INBOUND_OFF)
    if row.enabled is False:
        return row, _refuse(node, route, row.node_fqdn, request, 503, PEER_OFF)
    return row, None


async def forward(request: Request) -> Response:
    node = request.app.state.node
    route = request.scope["route_key"]
    peer, refused = _admitted(node, request, route)
    if refused is not None:
        return refused
    tracer = node.tracer
    began = time.time_ns() if tracer is not None else 0
    kind = request.headers.get("x-hub-pool-backend", "")  # no engine's kind is empty: BAD_BACKEND
    engines = [e for e in node.local.engines if e.kind == kind]
    if not engines:
        return _refuse(node, route, peer.node_fqdn, request, 400, BAD_BACKEND)
    try:
        raw, body = await read_json_object(request, node.env.max_body_bytes)
    except BadRequest as exc:
        return _refuse(node, route, peer.node_fqdn, request, exc.status, exc.message)
    model = request.headers.get("x-hub-pool-model") or body.get("model")
    if not isinstance(model, str) or not model:
        return _refuse(node, route, peer.node_fqdn, request, 400, 'Request body must include a "model" field')
    dialect, route_class = ROUTED[route]
    asked = PlacementRequest(route, dialect, route_class, model, body, raw, _wants_stream(dialect, route_class, body))
    plan = place_inbound(await snapshot_of(node, inbound=True, serving=(kind, model)), asked, kind)
    allowed = start_within.asked(request.headers)
    if allowed is not None and plan.candidates:
        busy = _busy(node, route, peer.node_fqdn, request, plan.candidates[0], allowed)
        if busy is not None:
            return busy
    rid = request.headers.get("x-hub-pool-request-id")
    row = node.routing_log.open(direction="inbound", path=route, model=model,
                                request_id=rid if rid and REQUEST_ID.fullmatch(rid) else None,
                                candidates=plan.able, stream=asked.stream, bodyBytes=len(raw),
                                budgetMs=plan.budget_ms)
    # only now, admitted by the peer guard, is the sender's trace context read
    span = None if tracer is None else tracer.start_forward(request.headers, route, row, model, peer.node_fqdn, began)
    if plan.diagnosis is not None:
        node.routing_log.touch(row, node=peer.node_fqdn, outcome="failed", status=502, durationMs=0, totalMs=0,
                               reason=plan.diagnosis)
        node.plugins.broadcast_request_finished(row)
        if span is not None:
            tracer.end_request(span, row, 502)
        return JSONResponse({"error": plan.diagnosis}, status_code=502)
    relay = RelayPlan(route=route, dialect=dialect, body=body, raw=raw, model=model, stream=asked.stream,
                      candidates=plan.candidates, row=row, budget_ms=plan.budget_ms, inbound_from=peer.node_fqdn,
                      num_ctx=plan.num_ctx, estimated_tokens=plan.estimated_tokens, span=span,
                      extra_headers=passed_headers(dialect, request.headers))
    return RelayResponse(node, relay)


async def local_listing(request: Request) -> Response:
    """A peer asking what this node's own engines list (no peers merged: no relay)."""
    node = request.app.state.node
    route = request.scope["route_key"]
    _peer, refused = _admitted(node, request, route)
    if refused is not None:
        return refused
    from hubpool_core.api.inference import native_tags_payload, openai_models_payload

    backends = await listing_backends(node.local)
    if route == "/v1/models":
        return JSONResponse(openai_models_payload(backends, []))
    return JSONResponse(native_tags_payload(backends, []))


async def local_show(request: Request) -> Response:
    node = request.app.state.node
    _peer, refused = _admitted(node, request, "/api/show")
    if refused is not None:
        return refused
    from hubpool_core.api.inference import MODEL_REQUIRED, describe_locally

    try:
        raw, body = await read_json_object(request, node.env.max_body_bytes)
    except BadRequest as exc:
        return JSONResponse({"error": exc.message}, status_code=exc.status)
    model = body.get("model") or body.get("name")
    if not isinstance(model, str) or not model:  # a peer's bad body is a 400, as an app's is
        return JSONResponse(MODEL_REQUIRED, status_code=400)
    answer = await describe_locally(node, raw, body)
    return answer or JSONResponse({"error": "model not found on this node"}, status_code=404)


async def local_response(request: Request) -> Response:
    """A peer asking this node's engine (X-Hub-Pool-Backend) for a response it stored."""
    node = request.app.state.node
    _peer, refused = _admitted(node, request, "/v1/responses")
    if refused is not None:
        return refused
    kind = request.headers.get("x-hub-pool-backend", "")
    engine = next((e for e in node.local.engines if e.kind == kind), None)
    if engine is None:
        return JSONResponse({"error": BAD_BACKEND}, status_code=400)
    rid = request.path_params["response_id"]
    if not RESPONSE_ID.fullmatch(rid):  # a peer's input: checked before it reaches an engine's URL
        return JSONResponse({"error": "invalid response id"}, status_code=400)
    path = "/v1/responses/" + rid
    try:
        reply = await node.local.http.get(engine.base_url + engine.upstream_path(RESPONSES, path),
                                          headers=engine.auth_headers())
    except Exception:  # noqa: BLE001 - the engine is down: the asking node says so to its app
        return JSONResponse({"error": f"this node's {kind} did not answer"}, status_code=502)
    return Response(reply.content, status_code=reply.status_code, media_type="application/json",
                    headers={"X-Hub-Pool-Backend": kind})


def _keyed(fn: Any, route: str) -> Any:
    async def endpoint(request: Request) -> Response:
        request.scope["route_key"] = route
        return await fn(request)

    endpoint.__name__ = fn.__name__ + "_" + route.strip("/").replace("/", "_")
    return endpoint


def build_router() -> APIRouter:
    router = APIRouter()
    for route in ROUTED:
        router.add_api_route(LOCAL_PREFIX + route, _keyed(forward, route), methods=["POST"])
    router.add_api_route(LOCAL_PREFIX + "/v1/models", _keyed(local_listing, "/v1/models"), methods=["GET"])
    router.add_api_route(LOCAL_PREFIX + "/api/tags", _keyed(local_listing, "/api/tags"), methods=["GET"])
    router.add_api_route(LOCAL_PREFIX + "/api/show", local_show, methods=["POST"])
    router.add_api_route(LOCAL_PREFIX + "/v1/responses/{response_id}", local_response, methods=["GET"])
    return router
