"""Operator advice routes: inference preferences, the client handout, and doctor."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from hubpool_core.api.inference import _guard, pool_offers
from hubpool_core.api.operator import _operator
from hubpool_core.config import PREFERENCE_KEYS, SettingsError, whole_in_range
from hubpool_core.engine import NATIVE
from hubpool_core.node.doctor import ACTION, run_checks
from hubpool_core.placement import usable_peers
from hubpool_core.placement.handout import DirectEngine, build_handout


async def get_preferences(request: Request) -> Response:
    if (refused := _operator(request)) is not None:
        return refused
    current = request.app.state.node.settings.current
    return JSONResponse({k: getattr(current, k) for k in PREFERENCE_KEYS})


async def patch_preferences(request: Request) -> Response:
    if (refused := _operator(request)) is not None:
        return refused
    try:
        changes = json.loads(await request.body() or b"{}")
    except (ValueError, UnicodeDecodeError, RecursionError):
        return JSONResponse({"error": "Request body is not valid JSON"}, status_code=400)
    if not isinstance(changes, dict):
        return JSONResponse({"error": "Request body must be a JSON object"}, status_code=400)
    try:
        updated = request.app.state.node.settings.patch(changes, allowed=PREFERENCE_KEYS)
    except SettingsError as exc:
        return JSONResponse({"error": str(exc), "errors": exc.errors}, status_code=422)
    return JSONResponse({k: getattr(updated, k) for k in PREFERENCE_KEYS})


async def handout(request: Request) -> Response:
    # apps ask for their own handout: the inference guard, not the operator credential
    if (refused := _guard(request)) is not None:
        return refused
    node = request.app.state.node
    params = request.query_params
    tools = params.get("tools", "").lower() in ("1", "true", "yes")
    min_context = None
    if params.get("minContext"):
        min_context = whole_in_range(params["minContext"], 0, None)
        if min_context is None:
            return JSONResponse({"error": "minContext must be a whole number of tokens"}, status_code=400)
    backends = await node.local.read(max(node.settings.current.poolProbeSnapshotTtlMs, 20_000))
    peers = usable_peers(node.peers.all(), node.directions().outbound.enabled)
    windows: dict[str, int] = {}
    for b in backends:
        for m in b.snapshot.result.models:
            if b.healthy and m.context_window:
                windows.setdefault(m.id, m.context_window)
    caps: dict[str, int | None] = {"local": node.settings.current.maxNumCtx}
    for p in peers:
        value = (p.last_capabilities or {}).get("maxNumCtx")
        caps[p.node_fqdn] = value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
    base = str(request.base_url).rstrip("/")  # built from the address the caller used
    offers = pool_offers(backends, peers, node.unservable.withheld_models)
    return JSONResponse(build_handout(base_url=base, offers=offers, windows=windows, caps=caps,
                                      preferred=node.settings.current.inferenceModel, tools=tools,
                                      min_context=min_context, direct=_direct_engines(node, backends)))


def _direct_engines(node: Any, backends: list[Any]) -> dict[str, DirectEngine] | None:
    """Model -> the local engine an app is pointed at directly, when apps are not routed
    through the pool: poolRouteAppsAlways off and no connected peer (a peer merely switched off
    for outbound still counts: apps stay on the proxy). None: apps point at the pool."""
    if node.settings.current.poolRouteAppsAlways:
        return None
    if any(p.status == "connected" and p.enabled is not False for p in node.peers.all()):
        return None
    out: dict[str, DirectEngine] = {}
    for b in backends:
        if not b.healthy:
            continue
        engine = b.engine
        direct = DirectEngine(openai_url=engine.base_url + engine.openai_prefix,
                              native_url=engine.base_url if NATIVE in engine.dialects else None,
                              product=engine.product, needs_key=bool(engine.config.api_key))
        for m in b.snapshot.result.models:
            out.setdefault(m.id, direct)
    return out


async def doctor(request: Request) -> Response:
    if (refused := _operator(request)) is not None:
        return refused
    checks = await run_checks(request.app.state.node)
    return JSONResponse({"ok": not any(c["verdict"] == ACTION for c in checks), "checks": checks})


def build_router() -> APIRouter:
    r = APIRouter()
    r.add_api_route("/api/inference/preferences", get_preferences, methods=["GET"])
    r.add_api_route("/api/inference/preferences", patch_preferences, methods=["PATCH"])
    r.add_api_route("/api/inference/pool/handout", handout, methods=["GET"])
    r.add_api_route("/api/inference/pool/doctor", doctor, methods=["GET"])
    return r


