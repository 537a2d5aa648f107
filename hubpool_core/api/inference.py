"""App-facing routes: both dialects, under /api/inference/pool/ and at the root."""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from hubpool_core import __version__
from hubpool_core.access.guards import bearer, inference_refusal
from hubpool_core.api.admission import (
    BATCH,
    INTERACTIVE,
    QUEUED_HEADER,
    QueuedResponse,
    error_body,
    free_first,
    retry_after_s,
    saturated,
)
from hubpool_core.api.dialects import AGENT_ROUTES, SPELLINGS, error_response, passed_headers, reshaped
from hubpool_core.config import whole_in_range
from hubpool_core.engine import AGENT_DIALECTS, NATIVE, OPENAI, RESPONSES
from hubpool_core.models_ids import fold_model_id, same_model
from hubpool_core.placement import (
    AUTO,
    AUTO_NOTHING,
    NoAutoModel,
    PlacementRequest,
    Plan,
    build_candidates,
    place,
    resolve_auto,
    snapshot_of,
    usable_peers,
)
from hubpool_core.placement import pool_offers as pool_offers  # re-exported: api/advice.py imports it here
from hubpool_core.placement.sessions import session_of
from hubpool_core.proxy import LOCAL_PREFIX, RelayPlan, RelayResponse
from hubpool_core.proxy.response_homes import RESPONSE_ID
from hubpool_core.signals.local_engines import LocalBackend, listing_backends

POOL_PREFIX = "/api/inference/pool"

#: route -> (dialect, route class)
ROUTED = {
    "/v1/chat/completions": (OPENAI, "chat"),
    "/v1/completions": (OPENAI, "completion"),
    "/v1/embeddings": (OPENAI, "embeddings"),
    "/api/chat": (NATIVE, "chat"),
    "/api/generate": (NATIVE, "completion"),
    "/api/embed": (NATIVE, "embeddings"),
    "/api/embeddings": (NATIVE, "embeddings"),
    **AGENT_ROUTES,
}
MODEL_REQUIRED = {"error": 'Request body must include a "model" field'}
#: owned_by of a model alias in /v1/models
ALIAS_OWNER = "hub-pool-alias"
PEER_SHOW_TIMEOUT_S = 15


class BadRequest(Exception):
    def __init__(self, status: int, message: str):
        self.status, self.message = status, message


def _client_ip(request: Request) -> str | None:
    return request.client.host if request.client else None


def _guard(request: Request, dialect: str | None = None) -> JSONResponse | None:
    node = request.app.state.node
    refusal = inference_refusal(_client_ip(request), dict(request.headers.items()), node.keys)
    if refusal is None:
        return None
    status, body = refusal
    if dialect in AGENT_DIALECTS:
        return reshaped(dialect, status, body)
    return JSONResponse(body, status_code=status)


async def read_json_object(request: Request, limit: int) -> tuple[bytes, dict[str, Any]]:
    """The body as bytes and as a JSON object, or a BadRequest saying what is wrong."""
    declared = whole_in_range(request.headers.get("content-length"), 0, None)
    if declared is not None and declared > limit:
        raise BadRequest(413, f"Request body is {declared} bytes; this node accepts at most {limit} "
                              "(HUB_POOL_MAX_BODY_BYTES)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(413, f"Request body exceeds {limit} bytes (HUB_POOL_MAX_BODY_BYTES)")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        raise BadRequest(400, "Request body is empty; send a JSON object with a \"model\" field")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BadRequest(400, f"Request body is not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise BadRequest(400, f"Request body must be a JSON object, not {type(body).__name__}")
    return raw, body


#: how lenient engines read a ``stream`` that is not a JSON boolean (``1``, ``"true"``)
_TRUE, _FALSE = (True, 1, "true", "True", "1"), (False, 0, "false", "False", "0")


def _wants_stream(dialect: str, route_class: str, body: dict[str, Any]) -> bool:
    """Whether the engine will stream its answer, read as a lenient engine reads ``stream``:
    a value no engine reads either way is left to the engine, which refuses it or not
    (the door judges only what no engine could serve)."""
    if route_class in ("embeddings", "count", "rerank"):
        return False
    stream = body.get("stream")
    if dialect == NATIVE:  # native routes stream unless the body says stream: false
        return not (isinstance(stream, (bool, int, str)) and stream in _FALSE)
    return isinstance(stream, (bool, int, str)) and stream in _TRUE


def _error(status: int, message: str, request_id: str | None = None) -> JSONResponse:
    headers = {"X-Hub-Pool-Request-Id": request_id} if request_id else None
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def routed(request: Request) -> Response:
    node = request.app.state.node
    route = request.scope["route_key"]
    dialect, route_class = ROUTED[route]
    refused = _guard(request, dialect)
    if refused is not None:
        return refused
    tracer = node.tracer
    began = time.time_ns() if tracer is not None else 0  # a traced request's span covers its placement
    try:
        raw, body = await read_json_object(request, node.env.max_body_bytes)
    except BadRequest as exc:
        return error_response(dialect, exc.status, exc.message)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return error_response(dialect, 400, MODEL_REQUIRED["error"])
    found = session_of(node.settings.current.poolSessionSources, request.headers, body)
    asked = PlacementRequest(route, dialect, route_class, model, body, raw, _wants_stream(dialect, route_class, body),
                             found[0] if found else None, found[1] if found else None)
    snapshot = await snapshot_of(node)
    plan = await place(snapshot, asked)
    if isinstance(plan, NoAutoModel):
        return error_response(dialect, 502, plan.message)
    held = node.response_homes.restrict(plan, body) if dialect == RESPONSES else None
    if held is not None:  # previous_response_id: only the engine that stored it can go on from it
        return error_response(dialect, 404, held, "previous_response_not_found")
    ordered, ctx = plan.candidates, plan.context
    row = node.routing_log.open(
        direction="outbound", path=route, model=plan.model, candidates=len(ordered),
        stream=asked.stream, bodyBytes=len(plan.raw), budgetMs=plan.budget_ms, requestedModel=plan.requested,
        **plan.sections,
    )
    span = None if tracer is None else tracer.start_route(route, row, plan.model, len(ordered), began)
    if plan.diagnosis is not None:
        node.routing_log.touch(row, outcome="failed", status=502, reason="no candidate", durationMs=0, totalMs=0)
        node.plugins.broadcast_request_finished(row)
        for stage in node.stages:
            try:
                stage.exhausted(ctx)
            except Exception:  # noqa: BLE001 - an observer must not break the answer
                pass
        local_backends = await node.local.describe_for_502(snapshot.backends, plan.model)
        headers = {"X-Hub-Pool-Request-Id": row["id"], **ctx.response_headers}
        if dialect in AGENT_DIALECTS:
            # a model no node lists at all is the app's mistake (404, as the APIs answer it);
            # one that is listed somewhere but cannot be served now is the pool's (502)
            known = any(b.lists(plan.model) for b in snapshot.backends) or any(
                same_model(m, plan.model) for m in pool_offers([], snapshot.peers))
            status = 502 if known else 404
            if not known:
                node.routing_log.touch(row, status=404, reason="no node lists this model")
            if span is not None:
                tracer.end_request(span, row, status)
            return error_response(dialect, status, plan.diagnosis if known else
                                  f'model "{plan.model}" is not served by this node or any connected peer',
                                  None if known else "model_not_found", headers, localBackends=local_backends)
        body_502 = {"error": plan.diagnosis, "localBackends": local_backends}
        if span is not None:
            tracer.end_request(span, row, 502)
        return JSONResponse(body_502, status_code=502, headers=headers)
    settings = snapshot.settings
    if settings.poolAdmissionQueue and (node.admission.waiting_for(plan.model)
                                        or saturated(plan, settings, node.engine_by_kind)):
        return _queued(request, node, asked, plan, row, span)
    if settings.poolAdmissionQueue:
        free_first(plan, settings, node.engine_by_kind)
    return _relay(node, asked, plan, row, span, request.headers)


def _relay(node: Any, asked: PlacementRequest, plan: Plan, row: dict[str, Any], span: Any, app_headers: Any,
           reserved: bool = False) -> RelayResponse:
    ctx = plan.context
    extra: dict[str, str] = {}
    if ctx.session_header and ctx.session_source == "X-Hub-Pool-Session":
        extra["X-Hub-Pool-Session"] = ctx.session_header
    extra.update(passed_headers(asked.dialect, app_headers))
    relay = RelayPlan(route=asked.route, dialect=asked.dialect, body=plan.body, raw=plan.raw, model=plan.model,
                      stream=asked.stream, candidates=plan.candidates, row=row, budget_ms=plan.budget_ms,
                      pin_note=plan.pin_note, extra_headers=extra, num_ctx=ctx.num_ctx, context=ctx,
                      observers=list(node.stages), estimated_tokens=plan.estimated_tokens, span=span,
                      reserved=reserved)
    return RelayResponse(node, relay)


async def get_response(request: Request) -> Response:
    """GET /v1/responses/{id}: asked of the engine that stored it, here or on its peer."""
    refused = _guard(request, RESPONSES)
    if refused is not None:
        return refused
    node = request.app.state.node
    rid = request.path_params["response_id"]
    if not RESPONSE_ID.fullmatch(rid):
        return error_response(RESPONSES, 400, "a response id is 1-200 letters, digits and . _ : -", "invalid_id")
    home = node.response_homes.home(rid)
    if home is None:
        return error_response(RESPONSES, 404, f'response "{rid}" is not known to this node: it relayed none with '
                              "that id (or restarted since)", "response_not_found")
    where, kind = home
    path = "/v1/responses/" + rid
    try:
        if where == "local":
            engine = next(e for e in node.local.engines if e.kind == kind)
            reply = await node.local.http.get(engine.base_url + engine.upstream_path(RESPONSES, path),
                                              headers=engine.auth_headers())
        else:
            peer = node.peers.by_fqdn(where)
            if peer is None:
                raise LookupError(where)
            headers = await node.peer_client.auth_headers(peer, "GET", LOCAL_PREFIX + path, None)
            reply = await node.peer_client.http.get(node.peer_client.base_url(where) + LOCAL_PREFIX + path,
                                                    timeout=PEER_SHOW_TIMEOUT_S,
                                                    headers={**headers, "X-Hub-Pool-Backend": kind})
    except Exception:  # noqa: BLE001 - the holder is gone or unreachable: say so, in the dialect's shape
        return error_response(RESPONSES, 503, f'response "{rid}" is held by {where}\'s {kind}, which cannot be '
                              "reached now", "response_holder_unavailable")
    return Response(reply.content, status_code=reply.status_code, media_type="application/json",
                    headers={"X-Hub-Pool-Served-By": where, "X-Hub-Pool-Backend": kind})


def _queued(request: Request, node: Any, asked: PlacementRequest, plan: Plan, row: dict[str, Any],
            span: Any) -> Any:
    """Every candidate is at its known concurrency (or requests for the model already wait):
    the request waits its turn in the admission queue, or is refused when the queue is full."""
    settings = node.settings.current
    token = bearer(dict(request.headers.items()))
    principal = node.keys.resolve(token) if token else None
    key = f"key:{principal.key_id}" if principal is not None else f"origin:{_client_ip(request)}"
    klass = BATCH if principal is not None and principal.key_id in settings.poolAdmissionBatchKeys else INTERACTIVE
    waiting = PlacementRequest(asked.route, asked.dialect, asked.route_class, plan.model, plan.body, plan.raw,
                               asked.stream, asked.session_header, asked.session_source)
    waiter = node.admission.enqueue(waiting, key, klass)
    if waiter is None:
        message = (f"Every node that serves {plan.model} is busy and {settings.poolAdmissionQueue} requests already "
                   "wait for one (poolAdmissionQueue); retry later")
        node.routing_log.touch(row, outcome="failed", status=429, queuedMs=0, durationMs=0, totalMs=0,
                               reason=message[:200])
        node.plugins.broadcast_request_finished(row)
        return Response(error_body(asked.dialect, 429, message), status_code=429, media_type="application/json",
                        headers={"Retry-After": str(retry_after_s(node.admission)),
                                 "X-Hub-Pool-Request-Id": row["id"], QUEUED_HEADER: "0"})

    def relay(placed: Any, waited: int) -> Any:
        if not isinstance(placed, Plan) or not placed.candidates:
            node.routing_log.touch(row, outcome="failed", status=502, durationMs=waited, totalMs=waited,
                                   reason="no candidate after the admission queue")
            node.plugins.broadcast_request_finished(row)
            message = placed.message if isinstance(placed, NoAutoModel) else placed.diagnosis
            return error_response(asked.dialect, 502, message, None,
                                  {"X-Hub-Pool-Request-Id": row["id"], QUEUED_HEADER: str(waited)})
        node.routing_log.touch(row, candidates=len(placed.candidates), **placed.sections)
        placed.context.response_headers[QUEUED_HEADER] = str(waited)
        return _relay(node, waiting, placed, row, span, request.headers, reserved=True)

    return QueuedResponse(node, waiter, row, plan.budget_ms, relay)


# -- listings ----------------------------------------------------------------------

def _peer_models(peers: list[Any]) -> list[str]:
    """Every model a usable peer's cached snapshot lists (merging costs no network call)."""
    out: list[str] = []
    for p in peers:
        caps = p.last_capabilities if isinstance(p.last_capabilities, dict) else {}
        if caps.get("acceptingWork") is False:
            continue
        for backend in caps.get("backends") or []:
            if backend.get("healthy"):
                out.extend(m for m in backend.get("modelsLoaded") or [] if isinstance(m, str))
    return out


def openai_models_payload(backends: list[LocalBackend], peers: list[Any],
                          aliases: dict[str, str] | None = None) -> dict[str, Any]:
    """/v1/models: every model a local engine or a usable peer lists, then each model alias
    (``owned_by: hub-pool-alias``), so a client that picks its model from this list (Claude
    Code's gateway discovery keeps ids containing "claude") can pick an alias too."""
    data, seen = [], set()
    for b in backends:
        for m in b.snapshot.result.models:
            key = fold_model_id(m.id)
            if key not in seen:
                seen.add(key)
                data.append({"id": m.id, "object": "model", "created": _epoch(m.modified_at),
                             "owned_by": m.owned_by or b.engine.kind})
    for model in _peer_models(peers):
        key = fold_model_id(model)
        if key not in seen:  # a peer publishes names only: nothing else is invented
            seen.add(key)
            data.append({"id": model, "object": "model", "created": 0, "owned_by": "hub-pool"})
    for alias in aliases or {}:
        key = fold_model_id(alias)
        if key not in seen:
            seen.add(key)
            data.append({"id": alias, "object": "model", "created": 0, "owned_by": ALIAS_OWNER})
    return {"object": "list", "data": data}


def native_tags_payload(backends: list[LocalBackend], peers: list[Any]) -> dict[str, Any]:
    models, seen = [], set()
    for b in backends:
        for m in b.snapshot.result.models:
            key = fold_model_id(m.id)
            if key not in seen:
                seen.add(key)
                models.append({"name": m.id, "model": m.id, "modified_at": m.modified_at, "size": m.size or 0,
                               "digest": m.digest or "", "details": dict(m.details or {})})
    for model in _peer_models(peers):
        key = fold_model_id(model)
        if key not in seen:
            seen.add(key)
            models.append({"name": model, "model": model, "modified_at": None, "size": 0, "digest": "",
                           "details": {}})
    return {"models": models}


async def _listing_sources(request: Request) -> tuple[list[LocalBackend], list[Any]]:
    node = request.app.state.node
    backends = await listing_backends(node.local)
    return backends, usable_peers(node.peers.all(), node.directions().outbound.enabled)


async def _listing(request: Request, payload_of: Any, key: str) -> Response:
    """Both listing routes: this node's engines plus every usable peer's cached inventory;
    a 502 only when neither has anything."""
    refused = _guard(request)
    if refused is not None:
        return refused
    backends, peers = await _listing_sources(request)
    payload = payload_of(backends, peers)
    # an alias is not a model: a pool with nothing listed still says so (spec: the listings)
    if not backends and not [m for m in payload[key] if m.get("owned_by") != ALIAS_OWNER]:
        return _error(502, "No local engine answered, and no connected peer lists a model")
    return JSONResponse(payload)


async def list_openai_models(request: Request) -> Response:
    aliases = request.app.state.node.settings.current.poolModelAliases
    return await _listing(request, lambda b, p: openai_models_payload(b, p, aliases), "data")


async def list_native_tags(request: Request) -> Response:
    return await _listing(request, native_tags_payload, "models")


async def list_running(request: Request) -> Response:
    refused = _guard(request)
    if refused is not None:
        return refused
    node = request.app.state.node
    backends = await listing_backends(node.local)
    models = []
    for b in backends:
        if not b.engine.has_residency:
            continue
        try:
            resident = await b.engine.residency(node.local.http) or []
        except Exception:  # noqa: BLE001 - a plugin bug must not fail the listing
            resident = []
        for r in resident:
            models.append({"name": r.id, "model": r.id, "size": r.size_vram or 0, "digest": "",
                           "details": {}, "expires_at": None, "size_vram": r.size_vram or 0,
                           "context_length": r.context_window})
    return JSONResponse({"models": models})


async def version(request: Request) -> Response:
    refused = _guard(request)
    if refused is not None:
        return refused
    node = request.app.state.node
    for b in await listing_backends(node.local):
        if NATIVE in b.engine.dialects:
            try:
                answer = await node.local.http.get(b.engine.base_url + "/api/version", headers=b.engine.auth_headers())
                if answer.status_code == 200 and isinstance(answer.json().get("version"), str):
                    return JSONResponse({"version": answer.json()["version"]})
            except Exception:  # noqa: BLE001 - fall back to hubpool's own version
                pass
    return JSONResponse({"version": __version__})


async def describe_locally(node: Any, raw: bytes, body: dict[str, Any]) -> Response | None:
    """This node's engines describe the model, or None when none of them holds it."""
    model = body.get("model") or body.get("name")
    if not isinstance(model, str) or not model:
        return None  # nothing names a model: no engine can hold it
    backends = [b for b in await node.local.read(node.settings.current.poolProbeSnapshotTtlMs)
                if b.healthy and b.lists(model)]
    for b in backends:
        if NATIVE in b.engine.dialects:
            try:
                answer = await node.local.http.post(b.engine.base_url + "/api/show", content=raw,
                                                    headers={"Content-Type": "application/json",
                                                             **b.engine.auth_headers()}, timeout=15)
            except Exception:  # noqa: BLE001 - try the next engine
                continue
            if answer.status_code < 500:
                return Response(answer.content, status_code=answer.status_code,
                                media_type="application/json", headers=_show_headers(b, model))
        else:
            return JSONResponse(_describe(b, model), headers=_show_headers(b, model))
    return None


async def show(request: Request) -> Response:
    refused = _guard(request)
    if refused is not None:
        return refused
    node = request.app.state.node
    try:
        raw, body = await read_json_object(request, node.env.max_body_bytes)
    except BadRequest as exc:
        return _error(exc.status, exc.message)
    model = body.get("model") or body.get("name")
    if not isinstance(model, str) or not model:
        return JSONResponse(MODEL_REQUIRED, status_code=400)
    peers = usable_peers(node.peers.all(), node.directions().outbound.enabled)
    if model == AUTO:
        backends = await node.local.read(node.settings.current.poolProbeSnapshotTtlMs)
        resolved = resolve_auto(backends, peers, node.settings.current.inferenceModel,
                                node.unservable.withheld_models)
        if resolved is None:
            return _error(502, AUTO_NOTHING)
        body = {**body, "model": resolved}
        body.pop("name", None)
        raw, model = json.dumps(body).encode(), resolved
    answer = await describe_locally(node, raw, body)
    if answer is not None:
        return answer
    # no local engine holds it: a connected peer that does describes it (no routing-log row)
    ranking = build_candidates(model, [], peers, node.load, local_affinity=0, pressure_weight=0,
                               poll_seconds=node.settings.current.poolHealthPollSeconds)
    for cand in ranking:
        path = LOCAL_PREFIX + "/api/show"
        try:
            headers = await node.peer_client.auth_headers(cand.peer, "POST", path, None)
            reply = await node.peer_client.http.post(
                node.peer_client.base_url(cand.node) + path, content=raw, timeout=PEER_SHOW_TIMEOUT_S,
                headers={**headers, "Content-Type": "application/json", "X-Hub-Pool-Backend": cand.backend,
                         "X-Hub-Pool-Model": model})
        except Exception:  # noqa: BLE001 - a stalled or refusing peer is skipped for the next
            continue
        if reply.status_code < 400:
            return Response(reply.content, status_code=reply.status_code, media_type="application/json",
                            headers={"X-Hub-Pool-Served-By": cand.node, "X-Hub-Pool-Backend": cand.backend,
                                     "X-Hub-Pool-Model": model})
    if ranking:
        return _error(502, f'No pool node could describe model "{model}"')
    return _error(404, f'model "{model}" not found on this node or its connected peers')


def _show_headers(b: LocalBackend, model: str) -> dict[str, str]:
    return {"X-Hub-Pool-Served-By": "local", "X-Hub-Pool-Backend": b.engine.kind, "X-Hub-Pool-Model": model}


def _describe(b: LocalBackend, model: str) -> dict[str, Any]:
    """An /api/show answer for a model an OpenAI-only engine holds: what its listing says."""
    info = next(m for m in b.snapshot.result.models if same_model(m.id, model))
    model_info: dict[str, Any] = {"general.architecture": "unknown"}
    if info.context_window:
        model_info["unknown.context_length"] = info.context_window
    return {"modelfile": "", "parameters": "", "template": "", "details": dict(info.details or {}),
            "model_info": model_info, "capabilities": ["completion"], "modified_at": info.modified_at}


def _epoch(iso: str | None) -> int:
    if not iso:
        return 0
    try:
        return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return 0


def build_router() -> APIRouter:
    router = APIRouter()
    for prefix in ("", POOL_PREFIX):
        for path, route in [*((r, r) for r in ROUTED), *SPELLINGS.items()]:
            router.add_api_route(prefix + path, _with_key(route), methods=["POST"], include_in_schema=bool(prefix))
        router.add_api_route(prefix + "/v1/responses/{response_id}", get_response, methods=["GET"])
        router.add_api_route(prefix + "/v1/models", list_openai_models, methods=["GET"])
        router.add_api_route(prefix + "/api/tags", list_native_tags, methods=["GET"])
        router.add_api_route(prefix + "/api/ps", list_running, methods=["GET"])
        router.add_api_route(prefix + "/api/version", version, methods=["GET"])
        router.add_api_route(prefix + "/api/show", show, methods=["POST"])
    return router


#: full path -> app-facing route, for the pure-ASGI fast path (:func:`serve_routed`)
FAST_PATHS = {prefix + path: route for prefix in ("", POOL_PREFIX)
              for path, route in [*((r, r) for r in ROUTED), *SPELLINGS.items()]}


async def serve_routed(app: Any, scope: dict[str, Any], receive: Any, send: Any, route: str,
                       handler: Any = None) -> None:
    """A routed POST straight from the ASGI server: the same handler (:func:`routed` unless
    another is named) and the same response, without FastAPI's routing, middleware stack
    and dependency solving, which cost more CPU per request than everything hubpool adds
    (docs/performance.md)."""
    scope["app"] = app
    scope["route_key"] = route
    response = await (handler or routed)(Request(scope, receive))
    await response(scope, receive, send)


def _with_key(route: str):  # noqa: ANN202 - FastAPI endpoint
    async def endpoint(request: Request) -> Response:
        request.scope["route_key"] = route
        return await routed(request)

    endpoint.__name__ = "routed_" + route.strip("/").replace("/", "_")
    return endpoint


