"""GET /metrics: the node's Prometheus metrics (docs/metrics.md).

Readable with the operator key or a qa:read key (Authorization: Bearer), or without a key
from loopback only: a loopback source, no reverse-proxy provenance header, and no
X-Forwarded-For hop that is not loopback (a local reverse proxy forwarding someone else
needs a key). A credential that is sent is always checked, from loopback too.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from hubpool_core.access.guards import PROVENANCE_HEADERS, bearer, operator_refusal, parse_ip
from hubpool_core.telemetry.metrics import CONTENT_TYPE, install


def from_loopback(client_ip: str | None, headers: dict[str, str]) -> bool:
    """A loopback caller with no provenance header and only loopback forwarding hops."""
    def loopback(value: str | None) -> bool:
        addr = parse_ip(value)
        return addr is not None and addr.is_loopback

    if not loopback(client_ip) or any(h in headers for h in PROVENANCE_HEADERS):
        return False
    forwarded = headers.get("x-forwarded-for")
    return not forwarded or all(loopback(hop) for hop in forwarded.split(","))


def refusal(client_ip: str | None, headers: dict[str, str], keys: Any) -> JSONResponse | None:
    """``None`` when the caller may read the metrics, else the operator routes' 401/403. A
    credential that is sent is always checked, from loopback too."""
    if bearer(headers) is None and from_loopback(client_ip, headers):
        return None
    result = operator_refusal("GET", "/metrics", headers, keys)  # an operator or qa:read key
    return JSONResponse(result[1], status_code=result[0]) if isinstance(result, tuple) else None


def build_router(node: Any) -> APIRouter:
    """The /metrics route; registers the node's metrics observer now, so every request the
    node settles from its start is counted."""
    metrics = install(node)
    router = APIRouter()

    async def get_metrics(request: Request) -> Response:
        client = request.client.host if request.client else None
        refused = refusal(client, dict(request.headers.items()), request.app.state.node.keys)
        if refused is not None:
            return refused
        return Response(metrics.exposition(), media_type=CONTENT_TYPE,
                        headers={"Cache-Control": "no-store"})

    router.add_api_route("/metrics", get_metrics, methods=["GET"], include_in_schema=False)
    return router
