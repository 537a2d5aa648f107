"""Pairing routes: the peer-facing handshake (/pair/*, /capabilities) and the operator's
peers, PIN, discovery, probe and rotation routes."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from hubpool_core.access.guards import source_ip, trusts_proxy
from hubpool_core.api.edge import BodyTooLarge, read_capped
from hubpool_core.api.operator import _operator
from hubpool_core.peering.addresses import AddressRefused, candidate_urls, parse_address, resolve_checked
from hubpool_core.peering.client import PeerAuthError
from hubpool_core.peering.discovery import MIN_PAIR_BY_ADDRESS_PROTOCOL, discover, probe_identify
from hubpool_core.peering.guard import PeerRefused, admit
from hubpool_core.peering.health import CLOCK_HEADER
from hubpool_core.peering.pairing import PairingError
from hubpool_core.peering.pairing_pin import PIN_SHAPE_MESSAGE, is_pin_shape
from hubpool_core.peering.peers import public_peer
from hubpool_core.peering.signing import clock_ms
from hubpool_core.placement import is_fresh
from hubpool_core.signals.containers import clamp_containers
from hubpool_core.store import PoolPeer

log = logging.getLogger("hubpool.api.peers")
P = "/api/inference/pool"
MAX_CONTROL_BODY = 64 * 1024


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def _body(request: Request) -> Any:
    # a stranger can call every route here: the limit holds before a byte is read (api/edge.py)
    try:
        raw = await read_capped(request, MAX_CONTROL_BODY)
    except BodyTooLarge as exc:
        raise PairingError(413, exc.message) from None
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise PairingError(400, "Request body is not valid JSON") from None


async def _object(request: Request) -> dict[str, Any]:
    body = await _body(request)
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise PairingError(400, "Request body must be a JSON object")
    return body


def caller_source_ip(request: Request, trust_proxy: bool) -> str | None:
    """The caller's IP for the PIN cooldown, only where it can be trusted (protocol §2f)."""
    return source_ip(request.client.host if request.client else None, request.headers, trust_proxy)


async def _guarded(request: Request) -> tuple[PoolPeer, Any]:
    body = await _body(request)
    node = request.app.state.node
    # the reference verifies the still-encoded path (Express originalUrl), not the decoded one
    raw_path = request.scope.get("raw_path") or request.url.path.encode()
    row = admit(node, request.method, raw_path.decode("latin-1"), request.headers.items(), body)
    return row, body


def _handles(fn):  # noqa: ANN001, ANN202 - wraps a handler so errors become the reference answers
    async def endpoint(request: Request) -> Response:
        try:
            return await fn(request)
        except PeerRefused as exc:
            return _error(exc.status, exc.message, exc.headers)
        except PairingError as exc:
            return _error(exc.status, exc.message)
    endpoint.__name__ = fn.__name__
    return endpoint


def _states_clock(fn):  # noqa: ANN001, ANN202 - the health probe's route only
    """This node's clock on every answer of the route, refusals too: a prober refused for its
    timestamp can then say whose clock is wrong (peering/health.py, clock_verdict). Only on the
    probe's route: a pairing refusal must stay byte-identical however it was earned."""
    async def endpoint(request: Request) -> Response:
        answer = await fn(request)
        answer.headers[CLOCK_HEADER] = str(clock_ms(getattr(request.app.state.node, "clock_offset_ms", 0)))
        return answer
    endpoint.__name__ = fn.__name__
    return endpoint


# -- peer-facing ---------------------------------------------------------------------

@_handles
async def pair_request(request: Request) -> Response:
    node = request.app.state.node
    body = await _object(request)
    ip = caller_source_ip(request, trusts_proxy(node.env.trust_proxy))
    return JSONResponse(await node.pairing.receive_request(body, ip))


@_handles
async def pair_confirm(request: Request) -> Response:
    row, body = await _guarded(request)
    if not isinstance(body, dict):
        raise PairingError(400, "Request body must be a JSON object")
    return JSONResponse(await request.app.state.node.pairing.receive_confirm(row, body))


@_handles
async def pair_reject(request: Request) -> Response:
    row, _ = await _guarded(request)
    return JSONResponse(request.app.state.node.pairing.receive_reject(row))


@_handles
async def pair_unpair(request: Request) -> Response:
    row, _ = await _guarded(request)
    return JSONResponse(request.app.state.node.pairing.receive_unpair(row))


@_handles
async def pair_upgrade(request: Request) -> Response:
    row, body = await _guarded(request)
    if not isinstance(body, dict):
        raise PairingError(400, "Request body must be a JSON object")
    return JSONResponse(await request.app.state.node.pairing.receive_upgrade(row, body))


@_states_clock
@_handles
async def capabilities(request: Request) -> Response:
    """Branch order: 401 (guard), 503 (master off), 403 (pairing incomplete), 200."""
    node = request.app.state.node
    row, _ = await _guarded(request)
    directions = node.directions()
    if not directions.master.enabled:
        return _error(503, directions.describe_master())
    if row.status not in ("connected", "unreachable"):
        return _error(403, "Peer is not connected")
    return JSONResponse(await node.capabilities(accepting=directions.inbound.enabled and row.enabled))


# -- operator ------------------------------------------------------------------------

def _op(fn):  # noqa: ANN001, ANN202 - operator credential, then the reference error answers
    async def endpoint(request: Request) -> Response:
        if (refused := _operator(request)) is not None:
            return refused
        try:
            return await fn(request)
        except PairingError as exc:
            return _error(exc.status, exc.message)
    endpoint.__name__ = fn.__name__
    return endpoint


@_op
async def list_peers(request: Request) -> Response:
    node = request.app.state.node
    return JSONResponse([_peer_row(r, node.settings.current.poolHealthPollSeconds) for r in node.peers.all()])


def _peer_row(row: PoolPeer, poll_seconds: int) -> dict[str, Any]:
    out = public_peer(row)
    caps = row.last_capabilities if isinstance(row.last_capabilities, dict) else {}
    cap = caps.get("maxNumCtx")
    out["maxNumCtx"] = cap if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else None
    # the same freshness rule /status applies: a snapshot routing no longer trusts is not a
    # reading of the peer's load now, and must not be shown as one
    out["containers"] = clamp_containers(caps.get("containers")) if is_fresh(row, poll_seconds) else None
    return out


@_op
async def discoverable(request: Request) -> Response:
    node = request.app.state.node
    status = await node.tailnet.status()
    exclude = {r.node_fqdn for r in node.peers.all()}
    result = await discover(node.directories, exclude=exclude, self_fqdn=await node.tailnet.self_fqdn(),
                            peer_url=node.peer_client.base_url, http=node.peer_client.http,
                            tailnet_connected=status.connected)
    return JSONResponse(result["peers"], headers={"X-Hub-Pool-Unanswered": str(len(result["unanswered"]))})


@_op
async def discoverable_full(request: Request) -> Response:
    """The merged list plus the devices that did not answer as a Hub (the guide's empty state)."""
    node = request.app.state.node
    status = await node.tailnet.status()
    exclude = {r.node_fqdn for r in node.peers.all()}
    return JSONResponse(await discover(node.directories, exclude=exclude, self_fqdn=await node.tailnet.self_fqdn(),
                                       peer_url=node.peer_client.base_url, http=node.peer_client.http,
                                       tailnet_connected=status.connected))


@_op
async def probe(request: Request) -> Response:
    node = request.app.state.node
    body = await _object(request)
    address = body.get("address")
    if not isinstance(address, str) or not 1 <= len(address) <= 300:
        raise PairingError(400, "address must be a string of 1 to 300 characters")
    try:
        target = parse_address(address)
        ips = await resolve_checked(target, allow_loopback=node.allow_loopback_peers)
    except (ValueError, AddressRefused) as exc:
        raise PairingError(400, str(exc)) from None
    result: dict[str, Any] = {"address": address, "isCiHub": False, "poolProtocol": None, "pairable": False,
                              "reason": "unreachable"}
    for url in candidate_urls(target, ips[0]):
        answer = await probe_identify(node.peer_client.http, url)
        if answer["reason"] == "unreachable":
            continue
        result.update(isCiHub=answer["isCiHub"], poolProtocol=answer["poolProtocol"])
        pairable = answer["isCiHub"] and (answer["poolProtocol"] or 1) >= MIN_PAIR_BY_ADDRESS_PROTOCOL
        result.update(pairable=bool(pairable), reason=None if pairable else answer["reason"] or "protocol_too_old")
        break
    return JSONResponse(result)


@_op
async def pair(request: Request) -> Response:
    node = request.app.state.node
    body = await _object(request)
    name, address, pin = body.get("nodeFqdn"), body.get("address"), body.get("pin")
    display = body.get("displayName")
    if (name is None) == (address is None):
        raise PairingError(400, "Send either nodeFqdn (a peer's tailnet name) or address (a LAN address to pair "
                                "with), not both and not neither")
    if pin is not None and not is_pin_shape(pin):
        raise PairingError(400, PIN_SHAPE_MESSAGE)
    if display is not None and not isinstance(display, str):
        raise PairingError(400, "displayName must be a string")
    if address is not None:
        if not isinstance(address, str):
            raise PairingError(400, "address must be a string")
        if pin is None:
            raise PairingError(400, "Pairing by address needs the six-digit PIN minted on the other Hub — its "
                                    "tailnet name is only disclosed to a caller that presents one")
        return JSONResponse(await node.pairing.pair_by_address(address, pin, display))
    if not isinstance(name, str):
        raise PairingError(400, "nodeFqdn must be a string")
    if pin is not None and not await _is_tailnet_name(node, name):
        # `hubpool probe hub-b.lan` advises `hubpool pair hub-b.lan --pin N`: a name that is not
        # a tailnet FQDN is a LAN name, and with a PIN it is an address (dialling https://hub-b.lan
        # would go nowhere: peers are reached only at their tailnet names)
        return JSONResponse(await node.pairing.pair_by_address(name, pin, display))
    return JSONResponse(await node.pairing.pair_by_name(name, display, pin))


async def _is_tailnet_name(node: Any, name: str) -> bool:
    """Whether ``name`` is under this tailnet's MagicDNS suffix (or, with no suffix known here,
    under Tailscale's own ``ts.net``): a name anything else is a LAN name."""
    text = name.strip().lower().rstrip(".")
    suffix = await node.tailnet.suffix()
    return text.endswith("." + (suffix or "ts.net"))


def _ident(request: Request) -> str:
    return request.path_params["peer_id"]


@_op
async def approve(request: Request) -> Response:
    return JSONResponse(await request.app.state.node.pairing.approve(_ident(request)))


@_op
async def reject(request: Request) -> Response:
    return JSONResponse(await request.app.state.node.pairing.reject(_ident(request)))


@_op
async def unpair(request: Request) -> Response:
    return JSONResponse(await request.app.state.node.pairing.unpair(_ident(request)))


@_op
async def enable_peer(request: Request) -> Response:
    return JSONResponse(request.app.state.node.pairing.set_enabled(_ident(request), True))


@_op
async def disable_peer(request: Request) -> Response:
    return JSONResponse(request.app.state.node.pairing.set_enabled(_ident(request), False))


@_op
async def upgrade_now(request: Request) -> Response:
    node = request.app.state.node
    try:
        row = node.peers.resolve(_ident(request))
    except LookupError:
        raise PairingError(404, "No pool peer with that id") from None
    if row.peer_public_key and row.signed_seen_at:
        # nothing to upgrade: re-running the exchange would only reopen the bearer grace on the
        # peer's side, so the route says so and calls nobody
        return JSONResponse(public_peer(row) | {
            "upgraded": False, "message": f"{row.node_fqdn} already signs its requests: there is nothing to upgrade"})
    try:
        return JSONResponse(public_peer(await node.health.upgrade(row)) | {"upgraded": True})
    except PeerAuthError as exc:
        raise PairingError(exc.status, str(exc)) from None


@_op
async def mint_pin(request: Request) -> Response:
    node = request.app.state.node
    message = node.directions().describe_master()
    if message:
        raise PairingError(503, message)
    now = int(datetime.now(UTC).timestamp() * 1000)
    digits, expires = node.pairing_pin.mint(now)
    identity = node.identity.get()
    log.info("pairing PIN minted; it expires in 10 minutes")  # never the digits
    return JSONResponse({"pin": digits, "expiresAt": _iso_ms(expires),
                         "nodeUuid": identity.node_uuid if identity else None,
                         "publicKeyFingerprint": identity.fingerprint if identity else None,
                         "identityError": node.identity.error})


@_op
async def cancel_pin(request: Request) -> Response:
    request.app.state.node.pairing_pin.cancel()
    return JSONResponse({"cancelled": True})


@_op
async def rotate(request: Request) -> Response:
    return JSONResponse(await request.app.state.node.pairing.rotate())


def _iso_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def build_router() -> APIRouter:
    r = APIRouter()
    r.add_api_route(P + "/pair/request", pair_request, methods=["POST"])
    r.add_api_route(P + "/pair/confirm", pair_confirm, methods=["POST"])
    r.add_api_route(P + "/pair/reject", pair_reject, methods=["POST"])
    r.add_api_route(P + "/pair/unpair", pair_unpair, methods=["POST"])
    r.add_api_route(P + "/pair/upgrade", pair_upgrade, methods=["POST"])
    r.add_api_route(P + "/capabilities", capabilities, methods=["GET"])
    r.add_api_route(P + "/peers", list_peers, methods=["GET"])
    r.add_api_route(P + "/peers/discoverable", discoverable, methods=["GET"])
    r.add_api_route(P + "/peers/discoverable/full", discoverable_full, methods=["GET"])
    r.add_api_route(P + "/peers/probe", probe, methods=["POST"])
    r.add_api_route(P + "/peers/pair", pair, methods=["POST"])
    r.add_api_route(P + "/peers/{peer_id}/approve", approve, methods=["POST"])
    r.add_api_route(P + "/peers/{peer_id}/reject", reject, methods=["POST"])
    r.add_api_route(P + "/peers/{peer_id}/enable", enable_peer, methods=["POST"])
    r.add_api_route(P + "/peers/{peer_id}/upgrade", upgrade_now, methods=["POST"])
    r.add_api_route(P + "/peers/{peer_id}/disable", disable_peer, methods=["POST"])
    r.add_api_route(P + "/peers/{peer_id}", unpair, methods=["DELETE"])
    r.add_api_route(P + "/pairing-pin", mint_pin, methods=["POST"])
    r.add_api_route(P + "/pairing-pin", cancel_pin, methods=["DELETE"])
    r.add_api_route(P + "/identity/rotate", rotate, methods=["POST"])
    return r
