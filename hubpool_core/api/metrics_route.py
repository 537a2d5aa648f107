"""GET /metrics: the node's Prometheus metrics (docs/metrics.md).

Readable with the operator key or a qa:read key (Authorization: Bearer), or without a key
from loopback only: a loopback source, no reverse-proxy provenance header, and no
X-Forwarded-For hop that is not loopback (a local reverse proxy forwarding someone else
needs a key). A credential that is sent is always checked, from loopback too.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from hubpool_core.access import PROVENANCE_HEADERS, bearer
from hubpool_core.metrics import CONTENT_TYPE, install

#: key scopes that may read the metrics
READERS = frozenset({"operator", "qa:read"})


def _loopback(value: str | None) -> bool:
    try:
        addr = ipaddress.ip_address((value or "").strip().strip("[]"))
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def from_loopback(client_ip: str | None, headers: dict[str, str]) -> bool:
    if not _loopback(client_ip) or any(h in headers for h in PROVENANCE_HEADERS):
        return False
    forwarded = headers.get("x-forwarded-for")
    return not forwarded or all(_loopback(hop) for hop in forwarded.split(","))


def refusal(client_ip: str | None, headers: dict[str, str], keys: Any) -> JSONResponse | None:
    """``None`` when the caller may read the metrics, else the 401/403 answer."""
    token = bearer(headers)
    if token is None:
        if from_loopback(client_ip, headers):
            return None
        return JSONResponse({"error": "Metrics need a credential from here: send Authorization: Bearer <operator "
                             "key or qa:read key> (create one with `hubpool api-key create --scope qa:read`)",
                             "code": "AUTH_ERROR_MISSING_CREDENTIAL"}, status_code=401)
    principal = keys.resolve(token)
    if principal is None:
        return JSONResponse({"error": "Invalid credential", "code": "AUTH_ERROR_INVALID_CREDENTIAL"},
                            status_code=401)
    if principal.scope not in READERS:
        return JSONResponse({"error": f"A key of scope {principal.scope} cannot read the metrics "
                             "(an operator or qa:read key can)", "code": "AUTH_ERROR_SCOPE"}, status_code=403)
    return None


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
