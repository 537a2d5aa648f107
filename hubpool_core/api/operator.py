"""Operator routes: settings, status, routing log, plugins, and the unauthenticated identify."""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from hubpool_core.access import operator_refusal
from hubpool_core.config import SettingsError
from hubpool_core.directions import resolve_directions
from hubpool_core.peers import public_peer
from hubpool_core.signing import normalize_peer_fqdn
from hubpool_core.routing_log import MAX_CAPACITY, parse_since

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
    except (ValueError, UnicodeDecodeError) as exc:
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
        raw = params["limit"]
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_CAPACITY:
            return JSONResponse({"error": f"limit must be a whole number from 1 to {MAX_CAPACITY}"}, status_code=400)
        limit = int(raw)
    since = None
    if "since" in params:
        try:
            since = parse_since(params["since"])
        except ValueError:
            return JSONResponse({"error": "since must be an ISO 8601 time with a zone (Z or an offset; "
                                          "send + as %2B)"}, status_code=400)
    return JSONResponse(request.app.state.node.routing_log.query(limit=limit, since=since))


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
    payload: dict[str, Any] = {
        **d.status_fields(connected_peers=len(connected),
                          connected_enabled_peers=sum(1 for r in connected if r.enabled)),
        "settings": settings.model_dump(),
        "tailscaleAdminApiConfigured": bool(node.env.tailscale_oauth_client_id and node.env.tailscale_oauth_client_secret),
        "localNode": {
            "nodeFqdn": normalize_peer_fqdn(tailnet.self_fqdn),
            "tailnet": tailnet.suffix,
            "tailscaleConnected": tailnet.connected,
            "inFlightRequests": node.in_flight,
            "hardwareTier": None,
            "backends": [
                {"type": b.engine.kind, "url": b.engine.base_url, "healthy": b.healthy,
                 "modelsLoaded": [m.id for m in b.snapshot.result.models], "error": b.snapshot.result.error}
                for b in backends
            ],
            "capabilitiesError": None,
            "identity": {
                "nodeUuid": identity.node_uuid if identity else None,
                "publicKeyFingerprint": identity.fingerprint if identity else None,
                "identityError": node.identity.error,
            },
        },
        "peers": [public_peer(r) | {"inFlightRequests": 0, "probeFailure": _failure(node, r)} for r in rows],
        "peerCounts": {
            "total": len(rows),
            "connected": len(connected),
            "pending": sum(1 for r in rows if r.status == "pending"),
            "unreachable": sum(1 for r in rows if r.status == "unreachable"),
            "disabled": sum(1 for r in rows if not r.enabled),
        },
        "pins": [],
        "pairingPin": node.pairing_pin.status(now),
        "routing": node.routing_log.summary(),
    }
    return JSONResponse(payload)


def _failure(node: Any, row: Any) -> dict[str, Any] | None:
    failure = node.health.failures.get(row.id)
    return failure.as_json() if failure else None


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
    router.add_api_route(P + "/status", status, methods=["GET"])
    router.add_api_route(P + "/plugins", plugins, methods=["GET"])
    return router
