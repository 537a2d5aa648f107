"""The pairing handshake: request, confirm, reject, unpair, upgrade, and rotation.

Each node approves its own inbound request; the sender waits. Rules and texts follow the
spec ("Set up a pool", "Peer identity", "What guards what") and protocol.md §2d/§3. A
``PairingError`` carries the HTTP status and the sentence the operator or peer sees.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from hubpool_core.peering.addresses import AddressRefused, candidate_urls, parse_address, resolve_checked
from hubpool_core.peering.client import HANDSHAKE_TIMEOUT_S, PeerAuthError
from hubpool_core.peering.pairing_pin import PIN_SHAPE_MESSAGE, is_pin_shape
from hubpool_core.peering.peers import (
    MAX_PENDING_INBOUND_REQUESTS,
    new_token,
    public_peer,
    seal_token,
    token_hash,
    utcnow,
)
from hubpool_core.peering.signing import normalize_peer_fqdn, verify_key_from_spki
from hubpool_core.store import PoolPeer

log = logging.getLogger("hubpool.pairing")

P = "/api/inference/pool"
BARE_HOSTNAME = "Peer node FQDN must be a bare hostname (no scheme, credentials, port, path or IP literal)"
SELF_PAIR = "That address is this Hub — a Hub cannot pair with itself"
TOO_MANY = "Too many pairing requests are already awaiting approval on this node"
OFF_TAILNET = "Pairing requests are only accepted from devices on this tailnet"
PIN_REFUSED = "Invalid or expired pairing PIN"
PIN_COOLDOWN = "Too many failed pairing attempts from this source; try again shortly"
MDNS_REFUSAL = ("A .local name is a LAN (mDNS) name, not a tailnet name: pair by the peer's MagicDNS name, or by "
                "address with a PIN (`hubpool pair <address> --pin <digits>`)")


class PairingError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def bearer_grace_ms(poll_seconds: int) -> int:
    """Ten minutes, or four health polls, whichever is longer."""
    return max(600_000, poll_seconds * 1000 * 4)


def _valid_claim(node_uuid: Any, public_key: Any) -> tuple[str, str] | None:
    """A peer identity claim is pinned only whole and only if the key parses."""
    if not isinstance(node_uuid, str) or not isinstance(public_key, str):
        return None
    try:
        uuid.UUID(node_uuid)
        verify_key_from_spki(public_key)
    except (ValueError, TypeError):
        return None
    return node_uuid, public_key


class Pairing:
    def __init__(self, node: Any):
        self.node = node

    # -- helpers ---------------------------------------------------------------------
    @property
    def repo(self):  # noqa: ANN201
        return self.node.peers

    async def _self_answer(self) -> dict[str, Any]:
        identity = self.node.identity.get()
        if identity is None:
            return {}
        return {"nodeUuid": identity.node_uuid, "publicKey": identity.public_key}

    def _pin_claim(self, peer_id: str, claim: tuple[str, str] | None, *, grace: bool) -> None:
        """Pin a peer's UUID and key together. ``grace``: learned from a request, so keep
        presenting the bearer until the peer is seen signing (spec: Upgrading)."""
        if claim is None:
            return
        holder = self.repo.by_node_uuid(claim[0])
        if holder is not None and holder.id != peer_id:
            log.warning("refusing to pin node UUID %s to a second peer row (already %s)", claim[0], holder.node_fqdn)
            return
        changes: dict[str, Any] = {"peer_node_uuid": claim[0], "peer_public_key": claim[1]}
        if grace:
            ms = bearer_grace_ms(self.node.settings.current.poolHealthPollSeconds)
            changes["bearer_grace_until"] = utcnow() + timedelta(milliseconds=ms)
        self.repo.update(peer_id, **changes)

    def _pin_answer(self, peer_id: str, answer: dict[str, Any]) -> None:
        """Pin the identity a PIN answer carried (learned from a response: this side signs at
        once), and once it is pinned, forget the bearer the PIN request carried: that request
        may have crossed a LAN in plain HTTP (pairing by address), and whoever read it could
        otherwise present the token as the peer on /pair/confirm and /local/* until the peer
        was first seen signing. The peer holds this node's key from the same request and
        signs its confirm, so a row keyed by a PIN answer takes signed calls only (issue 26,
        docs/pairing.md). Without a pinned key (a peer that cannot sign) the bearer is kept."""
        self._pin_claim(peer_id, _valid_claim(answer.get("nodeUuid"), answer.get("publicKey")), grace=False)
        row = self.repo.by_id(peer_id)
        if row is not None and row.peer_public_key:
            self.repo.update(peer_id, verify_token_hash=None)

    def _require_enabled(self) -> None:
        message = self.node.directions().describe_master()
        if message:
            raise PairingError(503, message)

    # -- the receiving side ----------------------------------------------------------
    async def receive_request(self, body: dict[str, Any], source_ip: str | None) -> dict[str, Any]:
        """POST /pair/request: the one unauthenticated write, checked in the reference order."""
        self._require_enabled()
        fqdn = normalize_peer_fqdn(body.get("fromNodeFqdn")) if isinstance(body.get("fromNodeFqdn"), str) else None
        raw = body.get("fromNodeFqdn")
        if fqdn is None or not isinstance(raw, str) or any(c in raw for c in ":/@?#[]"):
            raise PairingError(400, BARE_HOSTNAME)
        token = body.get("token")
        if not isinstance(token, str) or len(token.strip()) < 32:
            raise PairingError(400, "token must be a string of at least 32 characters")
        token = token.strip()
        display = body.get("fromDisplayName")
        if display is not None and (not isinstance(display, str) or not display):
            raise PairingError(400, "fromDisplayName must be a non-empty string when given")
        pin = body.get("pin")
        if pin is not None and not is_pin_shape(pin):
            raise PairingError(400, PIN_SHAPE_MESSAGE)  # no strike, no try spent: it was never a guess
        claim = None
        if pin is not None:
            self._consume_pin(pin, fqdn, source_ip)  # consumed before anything else (protocol §8.7)
            claim = _valid_claim(body.get("fromNodeUuid"), body.get("fromPublicKey"))
        own = await self.node.tailnet.self_fqdn()
        identity = self.node.identity.get()
        if fqdn == own or (claim and identity and claim[0] == identity.node_uuid):
            raise PairingError(400, SELF_PAIR)
        answer: dict[str, Any] = {"received": True}
        if pin is not None:
            answer |= {"nodeFqdn": own} if own else {}
            answer |= await self._self_answer()
        if self.repo.by_fqdn(fqdn) is not None:
            # spec: a request is ignored, without saying so, when a row for that name exists
            log.info("ignored a pairing request from %s: a row for that name already exists", fqdn)
            return answer if pin is not None else {}
        if self.repo.pending_inbound_count() >= MAX_PENDING_INBOUND_REQUESTS:
            raise PairingError(503, TOO_MANY)
        await self._check_membership(fqdn)
        row = self.repo.add(PoolPeer(
            node_fqdn=fqdn, display_name=display, direction="inbound", status="pending",
            present_token_encrypted=seal_token(self.node.node_secret(), fqdn, token),
        ))
        if claim is not None:
            self._pin_claim(row.id, claim, grace=True)
        log.info("pairing request from %s is waiting for approval (%s)", fqdn,
                 "with a valid PIN" if pin is not None else "no PIN: the name is only a claim")
        return answer

    def _consume_pin(self, pin: str, fqdn: str, source_ip: str | None) -> None:
        cooldown = self.node.pin_cooldown
        now = _now_ms()
        keys = [f"fqdn:{fqdn}"] + ([f"ip:{source_ip}"] if source_ip else [])
        if any(cooldown.blocked(k, now) for k in keys):
            raise PairingError(429, PIN_COOLDOWN)
        if not self.node.pairing_pin.consume(pin, now):
            for k in keys:
                cooldown.strike(k, now)
            raise PairingError(401, PIN_REFUSED)
        for k in keys:
            cooldown.clear(k)

    async def _check_membership(self, fqdn: str) -> None:
        # a node on no tailnet has nothing to compare a request's name against, and accepts
        if await self.node.tailnet.name_refusal(fqdn, unknown_suffix_ok=True) is not None:
            raise PairingError(403, OFF_TAILNET)

    async def receive_confirm(self, row: PoolPeer, body: dict[str, Any]) -> dict[str, Any]:
        if row.direction != "outbound" or row.status != "pending":
            raise PairingError(409, "No pending outbound pairing awaiting confirmation for this peer")
        token = body.get("token")
        if not isinstance(token, str) or len(token.strip()) < 32:
            raise PairingError(400, "token must be a string of at least 32 characters")
        self.repo.update(row.id, status="connected", consecutive_failures=0,
                         present_token_encrypted=seal_token(self.node.node_secret(), row.node_fqdn, token.strip()))
        if not row.peer_public_key:
            self._pin_claim(row.id, _valid_claim(body.get("fromNodeUuid"), body.get("fromPublicKey")), grace=True)
        log.info("pairing with %s confirmed by the peer", row.node_fqdn)
        return {"confirmed": True, **await self._self_answer()}

    def receive_reject(self, row: PoolPeer) -> dict[str, Any]:
        if row.direction == "outbound" and row.status == "pending":
            self.repo.delete(row.id)
            log.info("%s rejected our pairing request", row.node_fqdn)
        return {"acknowledged": True}

    def receive_unpair(self, row: PoolPeer) -> dict[str, Any]:
        self.repo.delete(row.id)
        log.info("%s unpaired from this node", row.node_fqdn)
        return {"acknowledged": True}

    async def receive_upgrade(self, row: PoolPeer, body: dict[str, Any]) -> dict[str, Any]:
        claim = _valid_claim(body.get("nodeUuid"), body.get("publicKey"))
        if claim is None:
            raise PairingError(400, "nodeUuid (a UUID) and publicKey (an Ed25519 SPKI key) are both required")
        self._pin_claim(row.id, claim, grace=True)
        return await self._self_answer()

    # -- the operator's side ---------------------------------------------------------
    async def pair_by_name(self, name: str, display_name: str | None, pin: str | None) -> dict[str, Any]:
        self._require_enabled()
        if name.strip().lower().rstrip(".").endswith(".local"):
            raise PairingError(400, MDNS_REFUSAL)
        fqdn = normalize_peer_fqdn(name)
        if fqdn is None:
            raise PairingError(400, BARE_HOSTNAME)
        if fqdn == await self.node.tailnet.self_fqdn():
            raise PairingError(409, f"{fqdn} is this Hub")
        if self.repo.by_fqdn(fqdn) is not None:
            raise PairingError(409, f"Already paired or pairing with {fqdn}")
        token = new_token()
        row = self.repo.add(PoolPeer(node_fqdn=fqdn, display_name=display_name, direction="outbound",
                                     status="pending", verify_token_hash=token_hash(token)))
        try:
            answer = await self._send_request(self.node.peer_client.base_url(fqdn), token, pin)
        except PairingError:
            self.repo.delete(row.id)
            raise
        if pin is not None:
            self._pin_answer(row.id, answer)
        return public_peer(self.repo.by_id(row.id))

    async def pair_by_address(self, address: str, pin: str, display_name: str | None) -> dict[str, Any]:
        self._require_enabled()
        own = await self.node.tailnet.self_fqdn()
        if own is None:
            raise PairingError(400, "This Hub has not joined a tailnet yet, so a peer would have no name to answer "
                                    "on. Run `tailscale up` here first.")
        try:
            target = parse_address(address)
            ips = await resolve_checked(target, allow_loopback=self.node.allow_loopback_peers)
        except (ValueError, AddressRefused) as exc:
            raise PairingError(400, str(exc)) from None
        del ips  # resolved and checked once to refuse early; the call below re-resolves
        token = new_token()
        last: PairingError | None = None
        try:
            # checked again right before the call that carries a credential outbound, and the
            # addresses that check returned are the ones dialled (a DNS answer cannot change between)
            ips = await resolve_checked(target, allow_loopback=self.node.allow_loopback_peers)
        except AddressRefused as exc:
            raise PairingError(400, str(exc)) from None
        for url in candidate_urls(target, ips[0]):
            try:
                answer = await self._send_request(url, token, pin)
            except PairingError as exc:
                last = exc
                if exc.status == 502:  # unreachable on this port: try the next
                    continue
                raise
            fqdn = normalize_peer_fqdn(answer.get("nodeFqdn")) if isinstance(answer.get("nodeFqdn"), str) else None
            if fqdn is None:
                raise PairingError(400, f"The Hub at {url} did not answer with a tailnet name. It has to be on a "
                                        "tailnet, and on pool protocol 2 or later, before it can be paired with "
                                        "by address.")
            if fqdn == own:
                raise PairingError(409, f"{url} is this Hub")
            # the name this node will dial for every forward from now on comes from the far side:
            # it must be a device of this tailnet, as a pairing request's name must (issue 26)
            refused = await self.node.tailnet.name_refusal(fqdn, unknown_suffix_ok=False)
            if refused is not None:
                log.warning("the Hub at %s answered with the name %s; not pairing: %s", url, fqdn, refused)
                raise PairingError(400, f"The Hub at {url} says its tailnet name is {fqdn}, but {refused}. "
                                        "Nothing was stored here. If that Hub is yours, sign it in to this "
                                        "tailnet and pair again; its pending request expires there in 24 hours.")
            if self.repo.by_fqdn(fqdn) is not None:
                raise PairingError(409, f"Already paired or pairing with {fqdn}")
            row = self.repo.add(PoolPeer(node_fqdn=fqdn, display_name=display_name, direction="outbound",
                                         status="pending", verify_token_hash=token_hash(token)))
            self._pin_answer(row.id, answer)
            return public_peer(self.repo.by_id(row.id))
        raise last or PairingError(502, f"No Hub answered at {address}")

    async def _send_request(self, base_url: str, token: str, pin: str | None) -> dict[str, Any]:
        own = await self.node.tailnet.self_fqdn()
        body: dict[str, Any] = {"fromNodeFqdn": own or "", "token": token}
        hostname = (own or "").split(".")[0]
        if hostname:
            body["fromDisplayName"] = hostname
        if pin is not None:
            body["pin"] = pin
            identity = self.node.identity.get()
            if identity is not None:  # the identity rides only with a PIN (protocol §2d)
                body["fromNodeUuid"] = identity.node_uuid
                body["fromPublicKey"] = identity.public_key
        try:
            answer = await self.node.peer_client.http.post(base_url + P + "/pair/request", json=body,
                                                           timeout=HANDSHAKE_TIMEOUT_S)
        except httpx.HTTPError as exc:
            log.warning("pairing request to %s failed: %s", base_url, type(exc).__name__)
            raise PairingError(502, f"Could not reach {base_url} ({type(exc).__name__}). Check that the other Hub "
                                    "is online, reachable over HTTPS on the tailnet, and has Hub Pool on; its "
                                    "first HTTPS request can wait on certificate issuance, so try again in a "
                                    "minute.") from None
        data = _json(answer)
        if answer.status_code >= 400:
            reason = data.get("error") if isinstance(data, dict) else None
            if pin is not None and answer.status_code in (401, 403):
                # protocol §2f: a 401 or a 403 to a PIN request reads the same to the operator; a
                # reason other than the PIN's own is added, so a 403 (outside its tailnet, say) is not lost
                log.warning("%s refused the pairing PIN (%s): %s", base_url, answer.status_code, reason)
                said = f" The other Hub said: {reason}" if reason and reason != PIN_REFUSED else ""
                raise PairingError(400, f"Peer refused the pairing PIN ({answer.status_code}). Mint a fresh one "
                                        f"on that Hub — a PIN is single-use and expires.{said}")
            log.warning("%s declined the pairing request (%s): %s", base_url, answer.status_code, reason)
            raise PairingError(502 if answer.status_code >= 500 and answer.status_code != 503 else 400,
                               f"The other Hub declined the pairing request ({answer.status_code}): "
                               f"{reason or 'no reason given'}")
        return data if isinstance(data, dict) else {}

    async def approve(self, ident: str) -> dict[str, Any]:
        row = self._resolve(ident)
        if row.direction == "outbound" and row.status == "pending":
            # the requester never approves: the Hub that received the request does
            own = await self.node.tailnet.self_fqdn()
            raise PairingError(409, f"This Hub sent the request to {row.node_fqdn}, so it is approved there: on "
                                    f"{row.node_fqdn}, run `hubpool approve {own or '<this Hub name>'}` (or "
                                    "Approve under Pending requests)")
        if row.direction != "inbound" or row.status != "pending":
            raise PairingError(409, f"{row.node_fqdn} is not a pending inbound request")
        token = new_token()
        row = self.repo.update(row.id, status="connected", verify_token_hash=token_hash(token),
                               consecutive_failures=0)
        body: dict[str, Any] = {"fromNodeFqdn": await self.node.tailnet.self_fqdn() or "", "token": token}
        body |= {("fromNodeUuid" if k == "nodeUuid" else "fromPublicKey"): v
                 for k, v in (await self._self_answer()).items()}
        try:
            answer = await self.node.peer_client.call(row, "POST", P + "/pair/confirm", body, prefer_signed=True,
                                                      fallback_to_bearer=True)
            if answer.status_code >= 400:
                raise RuntimeError(f"HTTP {answer.status_code}: {_json(answer)}")
            data = _json(answer) or {}
            if not row.peer_public_key:
                self._pin_claim(row.id, _valid_claim(data.get("nodeUuid"), data.get("publicKey")), grace=False)
            elif "X-Hub-Pool-Signature" in answer.request.headers:
                # the peer verified our signature and said yes: it holds our key, so the
                # grace that covered "my reply may not have arrived" is over (we sign from now on)
                self.repo.update(row.id, bearer_grace_until=None)
        except (httpx.HTTPError, RuntimeError, PeerAuthError) as exc:
            detail = f"{type(exc).__name__}" if isinstance(exc, httpx.HTTPError) else str(exc)
            log.warning("pairing confirmed locally but callback to %s failed: %s", row.node_fqdn, detail)
            # the approval stands (protocol §2d), but the operator must not read it as connected
            return public_peer(self.repo.by_id(row.id)) | {
                "callbackDelivered": False,
                "message": f"Approved here, but {row.node_fqdn} could not be told ({detail}): it still lists its "
                           "request as pending, so the two Hubs are half paired. Make sure each Hub reaches the "
                           "other over HTTPS (`hubpool doctor` on both), then unpair it here, cancel the request "
                           "there, and pair again."}
        return public_peer(self.repo.by_id(row.id)) | {"callbackDelivered": True, "message": None}

    async def reject(self, ident: str) -> dict[str, Any]:
        row = self._resolve(ident)
        if row.direction != "inbound" or row.status != "pending":
            raise PairingError(409, f"{row.node_fqdn} is not a pending inbound request; unpair it instead")
        self.repo.delete(row.id)
        await self._notify(row, "/pair/reject")
        return {"success": True}

    async def unpair(self, ident: str) -> dict[str, Any]:
        """Delete this node's row and tell the other node; the answer says whether it was told."""
        row = self._resolve(ident)
        self.repo.delete(row.id)
        own = await self.node.tailnet.self_fqdn() or "<this Hub name>"
        if row.direction == "outbound" and row.status == "pending" and not row.peer_public_key:
            # a request sent without a PIN: the other node holds no key for this one and has issued
            # it no token yet, so nothing could authenticate a withdrawal there (docs/pairing.md)
            return {"success": True, "told": False,
                    "message": f"Cancelled here. {row.node_fqdn} was not told: a request sent without a PIN "
                               "carries no credential to withdraw it with, so it stays pending there until an "
                               f"operator on {row.node_fqdn} rejects it (`hubpool reject {own}`) or it "
                               "expires after 24 hours."}
        told = await self._notify(row, "/pair/unpair")
        if told:
            return {"success": True, "told": True, "message": None}
        return {"success": True, "told": False,
                "message": f"Removed here, but {row.node_fqdn} could not be told: it still lists this Hub until "
                           f"you run `hubpool unpair {own}` on {row.node_fqdn}."}

    async def _notify(self, row: PoolPeer, route: str) -> bool:
        """Best-effort, authenticated: the other side drops its half at once."""
        try:
            answer = await self.node.peer_client.call(row, "POST", P + route, None)
            ok = answer.status_code < 400
        except (httpx.HTTPError, PeerAuthError) as exc:
            log.info("could not tell %s (%s): %s", row.node_fqdn, route, exc)
            return False
        if not ok:
            log.info("%s answered %s to %s", row.node_fqdn, answer.status_code, route)
        return ok

    def set_enabled(self, ident: str, enabled: bool) -> dict[str, Any]:
        row = self._resolve(ident)
        return public_peer(self.repo.update(row.id, enabled=enabled))

    async def rotate(self) -> dict[str, Any]:
        """New keypair, same UUID; every peer is told (signed with the old key) and unpaired.

        Checked first, changed after: an identity that cannot load (or a node secret that cannot
        be read) answers 503 with every pairing untouched, because the unpair calls and the row
        deletion cannot be undone and a rotation that then fails would leave the node unpaired
        with its old, broken key."""
        if self.node.identity.get() is None:
            raise PairingError(503, f"This node's pool identity cannot be loaded: {self.node.identity.error}. "
                                    "Nothing was changed: every pairing is still in place.")
        try:
            await asyncio.to_thread(self.node.identity.check_rotatable)
        except Exception as exc:  # noqa: BLE001 - any reason the rotation could not finish refuses it whole
            raise PairingError(503, f"This node's pool key cannot be rotated: {exc or type(exc).__name__}. "
                                    "Nothing was changed: every pairing is still in place.") from None
        rows = self.repo.all()
        told = await asyncio.gather(*(self._notify(r, "/pair/unpair") for r in rows))
        unreachable = [r.node_fqdn for r, ok in zip(rows, told, strict=True) if not ok]
        self.repo.delete_all()
        keypair = self.node.identity.rotate()
        return {"nodeUuid": keypair.node_uuid, "publicKeyFingerprint": keypair.fingerprint,
                "unpaired": [r.node_fqdn for r in rows], "unreachable": unreachable}

    def _resolve(self, ident: str) -> PoolPeer:
        try:
            return self.repo.resolve(ident)
        except LookupError as exc:
            raise PairingError(404, str(exc)) from None


def _json(answer: httpx.Response) -> Any:
    try:
        return answer.json()
    except (ValueError, RecursionError):
        return None


def _now_ms() -> int:
    return int(datetime.now(UTC).timestamp() * 1000)
