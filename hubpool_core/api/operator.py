"""Operator routes: settings, status, routing log, plugins, and the unauthenticated identify."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from hubpool_core.access.guards import operator_refusal
from hubpool_core.config import Pin, SettingsError, env_int, whole_in_range
from hubpool_core.node.directions import resolve_directions
from hubpool_core.peering.peers import public_peer
from hubpool_core.peering.signing import normalize_peer_fqdn
from hubpool_core.placement import is_fresh
from hubpool_core.placement.handout import effective_ceiling
from hubpool_core.placement.throughput import advertised_estimates, peer_snapshot_age_ms
from hubpool_core.signals.containers import clamp_containers
from hubpool_core.signals.pressure_bands import read_band, wire_source_name
from hubpool_core.store.history import MAX_PAGE as HISTORY_MAX_PAGE
from hubpool_core.store.history import parse_when
from hubpool_core.telemetry.routing_log import MAX_CAPACITY, parse_since

P = "/api/inference/pool"


def _operator(request: Request) -> JSONResponse | None:
    node = request.app.state.node
    result = operator_refusal(request.method, request.url.path, dict(request.headers.items()), node.keys)
    if isinstance(result, tuple):
        return JSONResponse(result[1], status_code=result[0])
    return None


async def identify(request: Request) -> Response:
    return JSONResponse({"isCiHub": True, "poolProtocol": 2})


async def get_settings(request: Request) -> Response:
    if (refused := _operator(request)) is not None:
        return refused
    return JSONResponse(request.app.state.node.settings.current.model_dump())


async def patch_settings(request: Request) -> Response:
    if (refused := _operator(request)) is not None:
        return refused
    try:
        changes = json.loads(await request.body() or b"{}")
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        return JSONResponse({"error": f"Request body is not valid JSON ({exc})"}, status_code=400)
    if not isinstance(changes, dict):
        return JSONResponse({"error": "Request body must be a JSON object of settings"}, status_code=400)
    try:
        updated = request.app.state.node.settings.patch(changes)
    except SettingsError as exc:
        return JSONResponse({"error": str(exc), "errors": exc.errors}, status_code=422)
    return JSONResponse(updated.model_dump())


async def routing_log(request: Request) -> Response:
    if (refused := _operator(request)) is not None:
        return refused
    params = request.query_params
    limit = None
    if "limit" in params:
        limit = whole_in_range(params["limit"], 1, MAX_CAPACITY)
        if limit is None:
            return JSONResponse({"error": f"limit must be a whole number from 1 to {MAX_CAPACITY}"}, status_code=400)
    since = None
    if "since" in params:
        try:
            since = parse_since(params["since"])
        except ValueError:
            return JSONResponse({"error": "since must be an ISO 8601 time with a zone (Z or an offset; "
                                          "send + as %2B)"}, status_code=400)
    return JSONResponse(request.app.state.node.routing_log.query(limit=limit, since=since))


HISTORY_OUTCOMES = ("served", "failed")
HISTORY_DIRECTIONS = ("outbound", "inbound")


async def routing_history(request: Request) -> Response:
    """GET /routing-history: settled rows from the persisted history (docs/history.md), newest
    first, each exactly as the ring held it; filters since/until/model/node/outcome/direction."""
    if (refused := _operator(request)) is not None:
        return refused
    node = request.app.state.node
    if node.history_store is None:
        return JSONResponse({"error": "Routing history is off on this node: set HUB_POOL_HISTORY=sqlite (or a "
                                      "database URL) and restart it (docs/history.md)",
                             "code": "history_off"}, status_code=409)
    params = request.query_params
    limit = whole_in_range(params.get("limit", "1000"), 1, HISTORY_MAX_PAGE)
    if limit is None:
        return JSONResponse({"error": f"limit must be a whole number from 1 to {HISTORY_MAX_PAGE}"}, status_code=400)
    filters: dict[str, Any] = {}
    for key in ("since", "until"):
        if params.get(key):
            try:
                filters[key] = parse_when(params[key])
            except ValueError as exc:
                return JSONResponse({"error": f"{key}: {exc}"}, status_code=400)
    for key, allowed in (("outcome", HISTORY_OUTCOMES), ("direction", HISTORY_DIRECTIONS)):
        if params.get(key):
            if params[key] not in allowed:
                return JSONResponse({"error": f"{key} must be one of {', '.join(allowed)}"}, status_code=400)
            filters[key] = params[key]
    for key in ("model", "node"):
        if params.get(key):
            filters[key] = params[key].strip()
    found = await asyncio.to_thread(node.history_store.query, limit=limit, **filters)
    return JSONResponse({**found, "history": node.history.status() if node.history else None})


async def status(request: Request) -> Response:
    if (refused := _operator(request)) is not None:
        return refused
    node = request.app.state.node
    settings = node.settings.current
    d = resolve_directions(node.env, settings)
    backends = await node.local.read(max(settings.poolProbeSnapshotTtlMs, 20_000))
    tailnet = await node.tailnet.status()
    rows = node.peers.all()
    connected = [r for r in rows if r.status == "connected"]
    identity = node.identity.get()
    now = int(time.time() * 1000)
    ceiling, set_by = effective_ceiling(node.env, settings)
    payload: dict[str, Any] = {
        **d.status_fields(connected_peers=len(connected),
                          connected_enabled_peers=sum(1 for r in connected if r.enabled)),
        "settings": settings.model_dump(),
        # the store: which backend, and whether it answers (a node keeps routing without it)
        "database": node.db.status(),
        # off, and (when HUB_POOL_HISTORY names a database that cannot be opened) why
        "history": node.history.status() if node.history is not None else {
            "enabled": False, **({"error": node.history_error} if node.history_error else {})},
        "tailscaleAdminApiConfigured": bool(node.env.tailscale_oauth_client_id
                                            and node.env.tailscale_oauth_client_secret),
        "localNode": {
            "nodeFqdn": normalize_peer_fqdn(tailnet.self_fqdn),
            "tailnet": tailnet.suffix,
            "tailscaleConnected": tailnet.connected,
            "inFlightRequests": node.load.local,
            "hardwareTier": node.hardware_tier,
            "maxPromptTokens": ceiling,
            "maxPromptTokensSetBy": set_by,
            "maxNumCtx": settings.maxNumCtx,
            "ollamaSlots": settings.ollamaSlots,
            "throughput": node.throughput.estimates("local"),
            # predicted time to first token's evidence (hubpool's own, docs/placement.md)
            **_engine_state(node, backends),
            "gpuPressure": node.pressure.band,
            "gpuPressureSource": wire_source_name(node.pressure.source) if node.pressure.source else None,
            # this node's own last container sample (None: no source, or none recent), shared
            # with peers only while poolShareContainerStats is on
            "containers": node.containers.current(),
            "backends": [
                {"type": b.engine.kind, "url": b.engine.base_url, "healthy": b.healthy,
                 "modelsLoaded": [m.id for m in b.snapshot.result.models], "error": b.snapshot.result.error,
                 "dialects": sorted(b.dialects), "agentDialectsKnown": b.snapshot.result.dialects is not None}
                for b in backends
            ],
            "capabilitiesError": None,
            "identity": {
                "nodeUuid": identity.node_uuid if identity else None,
                "publicKeyFingerprint": identity.fingerprint if identity else None,
                "identityError": node.identity.error,
            },
        },
        "peers": [public_peer(r) | _peer_extras(node, r) for r in rows],
        "peerCounts": {
            "total": len(rows),
            "connected": len(connected),
            "pending": sum(1 for r in rows if r.status == "pending"),
            "unreachable": sum(1 for r in rows if r.status == "unreachable"),
            "disabled": sum(1 for r in rows if not r.enabled),
        },
        # hubpool's own: each setting this node's environment holds in force over what
        # settings.json says (the CLI warns when it writes one of them, as `hubpool enable` does)
        "environmentOverrides": environment_overrides(node.env, settings, ceiling if set_by == "env" else None),
        "pins": status_pins(node, backends),
        "pairingPin": node.pairing_pin.status(now),
        "routing": node.routing_log.summary(),
        "admission": {"enabled": bool(settings.poolAdmissionQueue), "size": settings.poolAdmissionQueue,
                      **node.admission.status()},
    }
    return JSONResponse(payload)


def environment_overrides(env: Any, settings: Any, env_ceiling: int | None) -> dict[str, dict[str, Any]]:
    """Setting -> ``{"variable", "value"}`` for every persisted setting an environment variable
    overrides right now: writing that setting changes nothing until the variable goes."""
    out: dict[str, dict[str, Any]] = {}
    for key, variable, flag in (("poolEnabled", "HUB_POOL_USER_DISABLED", env.user_disabled),
                                ("poolOutboundEnabled", "HUB_POOL_OUTBOUND_DISABLED", env.outbound_disabled),
                                ("poolInboundEnabled", "HUB_POOL_INBOUND_DISABLED", env.inbound_disabled)):
        if flag == "true":  # the kill switches' one spelling (node/directions.py)
            out[key] = {"variable": variable, "value": "true"}
    if env_ceiling is not None:
        out["poolMaxPromptTokens"] = {"variable": "HUB_POOL_MAX_PROMPT_TOKENS", "value": env_ceiling}
    poll = env_int(env.dev_health_poll_seconds, minimum=1, maximum=300)
    if poll is not None:
        out["poolHealthPollSeconds"] = {"variable": "HUB_POOL_DEV_HEALTH_POLL_SECONDS", "value": poll}
    if env.disabled_plugin_names:  # off by the environment whatever pluginsDisabled says
        out["pluginsDisabled"] = {"variable": "HUB_POOL_PLUGINS_DISABLED", "value": sorted(env.disabled_plugin_names)}
    return out


def _engine_state(node: Any, backends: list[Any]) -> dict[str, Any]:
    """What this node's engines report at once, hold in memory, and how fast they measured:
    ``resident`` is null for an engine whose residency is unknown, never empty for it."""
    return {"engineSlots": [{"backend": b.engine.kind, "slots": b.snapshot.result.slots} for b in backends
                            if b.snapshot.result.slots],
            "resident": [{"backend": b.engine.kind, "models": node.residency.models("local", b.engine.kind)}
                         for b in backends],
            "speed": node.speed.advertised("local")}


def _peer_extras(node: Any, row: Any) -> dict[str, Any]:
    """The clamped, freshness-gated readings of a peer's snapshot — never the raw JSON."""
    caps = row.last_capabilities if isinstance(row.last_capabilities, dict) else {}
    fresh = is_fresh(row, node.settings.current.poolHealthPollSeconds)
    band = read_band(caps.get("gpuPressure")) if fresh else None
    forwarded = node.load.forwarded.get(row.id, 0)
    return {
        "inFlightRequests": forwarded,
        "probeFailure": _failure(node, row),
        "gpuPressure": max(band, min(3, forwarded)) if band is not None else None,
        "containers": clamp_containers(caps.get("containers")) if fresh else None,
        "maxPromptTokens": _positive(caps.get("maxPromptTokens")),
        "maxNumCtx": _positive(caps.get("maxNumCtx")),
        "ollamaSlots": _positive(caps.get("ollamaSlots")),
        "resident": caps.get("resident") if fresh and isinstance(caps.get("resident"), list) else None,
        "speed": {"observed": node.speed.advertised(row.node_fqdn),
                  "advertised": caps.get("speed") if fresh and isinstance(caps.get("speed"), list) else []},
        # what routing reads of the peer's report (validated, aged), stale snapshot or not
        "throughput": {"observed": node.throughput.observed(row.node_fqdn),
                       "advertised": advertised_estimates(caps, node.settings.current.poolHealthPollSeconds,
                                                          snapshot_age_ms=peer_snapshot_age_ms(row))},
    }


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _failure(node: Any, row: Any) -> dict[str, Any] | None:
    failure = node.health.failures.get(row.id)
    return failure.as_json() if failure else None


async def add_pin(request: Request) -> Response:
    if (refused := _operator(request)) is not None:
        return refused
    node = request.app.state.node
    try:
        body = json.loads(await request.body() or b"{}")
        pin = Pin(**body) if isinstance(body, dict) else None
    except (ValueError, TypeError, ValidationError, RecursionError) as exc:
        return JSONResponse({"error": f"Invalid pin: {_first_error(exc)}"}, status_code=400)
    if pin is None:
        return JSONResponse({"error": "Request body must be a JSON object"}, status_code=400)
    if (pin.scope == "model") != bool(pin.model):
        return JSONResponse({"error": "model is required exactly when scope is model"}, status_code=400)
    if (pin.targetKind == "peer") != bool(pin.targetPeerId):
        return JSONResponse({"error": "targetPeerId is required exactly when targetKind is peer"}, status_code=400)
    if pin.targetKind == "peer" and node.peers.by_id(pin.targetPeerId) is None:
        return JSONResponse({"error": f"No pool peer with id {pin.targetPeerId}"}, status_code=404)
    pins = [p for p in node.settings.current.poolPins if (p.scope, p.model) != (pin.scope, pin.model)] + [pin]
    try:
        updated = node.settings.replace_pins(pins)
    except ValidationError:
        return JSONResponse({"error": "At most 64 pins"}, status_code=422)
    return JSONResponse({"pins": [p.model_dump() for p in updated.poolPins]})


async def delete_pin(request: Request) -> Response:
    if (refused := _operator(request)) is not None:
        return refused
    node = request.app.state.node
    scope, model = request.query_params.get("scope"), request.query_params.get("model")
    if scope not in ("default", "model") or (scope == "model") != bool(model):
        return JSONResponse({"error": "scope must be default, or model with ?model=<id>"}, status_code=400)
    pins = [p for p in node.settings.current.poolPins if (p.scope, p.model) != (scope, model or None)]
    updated = node.settings.replace_pins(pins)
    return JSONResponse({"pins": [p.model_dump() for p in updated.poolPins]})


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        e = exc.errors()[0]
        return f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}"
    return str(exc)


def status_pins(node: Any, backends: list[Any]) -> list[dict[str, Any]]:
    """Every pin with its target named and targetAvailable from the ranker's own predicates."""
    from hubpool_core.placement import peer_offers
    from hubpool_core.placement.pins import local_target_available

    out = []
    for pin in node.settings.current.poolPins:
        row: dict[str, Any] = pin.model_dump()
        if pin.targetKind == "local":
            row["nodeFqdn"] = None
            row["targetAvailable"] = local_target_available(pin.model, backends, node.unservable.withheld_models)
        else:
            peer = node.peers.by_id(pin.targetPeerId)
            row["nodeFqdn"] = peer.node_fqdn if peer else None
            caps = peer.last_capabilities if peer and isinstance(peer.last_capabilities, dict) else None
            usable = bool(peer and peer.status == "connected" and peer.enabled and caps
                          and caps.get("acceptingWork") is not False)
            if usable and pin.model is not None:
                usable = peer_offers(peer, pin.model) is not None
            elif usable and caps is not None:  # usable implies caps; the check narrows it
                usable = any(b.get("healthy") for b in caps.get("backends") or [])
            row["targetAvailable"] = usable
        out.append(row)
    return out


async def plugins(request: Request) -> Response:
    if (refused := _operator(request)) is not None:
        return refused
    return JSONResponse({"plugins": [r.as_json() for r in request.app.state.node.plugins.records]})


def build_router() -> APIRouter:
    router = APIRouter()
    router.add_api_route(P + "/identify", identify, methods=["GET"])
    router.add_api_route(P + "/settings", get_settings, methods=["GET"])
    router.add_api_route(P + "/settings", patch_settings, methods=["PATCH"])
    router.add_api_route(P + "/routing-log", routing_log, methods=["GET"])
    router.add_api_route(P + "/routing-history", routing_history, methods=["GET"])
    router.add_api_route(P + "/status", status, methods=["GET"])
    router.add_api_route(P + "/plugins", plugins, methods=["GET"])
    router.add_api_route(P + "/pins", add_pin, methods=["POST"])
    router.add_api_route(P + "/pins", delete_pin, methods=["DELETE"])
    return router
