"""PoolPeerGuard: admits a peer by Ed25519 signature (preferred) or by the legacy bearer.

Every refusal is a 401 with one of the reference texts; the only named refusal is
``X-Hub-Pool-Refusal: identity-mismatch`` (protocol.md §2e "Guard").
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from hubpool_core.access.guards import bearer
from hubpool_core.peering.peers import tokens_match, utcnow
from hubpool_core.peering.signing import (
    REFUSAL_HEADER,
    REFUSAL_IDENTITY_MISMATCH,
    clock_ms,
    normalize_peer_fqdn,
    recipient_mismatch,
    verify_headers,
)
from hubpool_core.store import PoolPeer

log = logging.getLogger("hubpool.guard")

INVALID = "Invalid pool peer credentials"
MISSING = "Missing pool peer credentials"
UNKNOWN = "Unknown pool peer"
BAD_TOKEN = "Invalid pool peer token"
NOT_YET = "This node restarted and cannot yet judge a request signed before it started; retry in a moment"


class PeerRefused(Exception):
    def __init__(self, message: str, headers: dict[str, str] | None = None, status: int = 401):
        super().__init__(message)
        self.message, self.headers, self.status = message, headers or {}, status


#: Headers that carry a credential or a signed value. A request repeating any of them is
#: refused: two copies are ambiguous (a proxy may keep the first, we the last), and that
#: ambiguity is how a signed value gets smuggled past a check that read the other copy.
CREDENTIAL_HEADERS = frozenset({
    "authorization", "x-hub-pool-node", "x-hub-pool-peer", "x-hub-pool-timestamp",
    "x-hub-pool-nonce", "x-hub-pool-signature", "x-hub-pool-recipient",
})


def single_valued(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, str]:
    """Lower-cased header dict from a mapping or a list of (name, value) pairs (Starlette's
    ``request.headers.items()`` keeps repeats); PeerRefused when a credential header repeats."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    out: dict[str, str] = {}
    for name, value in pairs:
        key = str(name).lower()
        if key in out:
            if key in CREDENTIAL_HEADERS:
                raise PeerRefused(INVALID)
            continue  # a repeated ordinary header keeps its first value (protocol.md §2a)
        out[key] = value
    return out


def admit(node: Any, method: str, path: str, headers: Mapping[str, str] | Iterable[tuple[str, str]],
          body: Any) -> PoolPeer:
    """The peer row behind a request, or PeerRefused. ``headers`` is a mapping or the request's
    raw (name, value) pairs; pass the pairs, so a repeated credential header is seen and refused."""
    headers = single_valued(headers)
    if headers.get("x-hub-pool-node"):
        return _admit_signed(node, method, path, headers, body)
    return _admit_bearer(node, headers)


def _admit_signed(node: Any, method: str, path: str, headers: dict[str, str], body: Any) -> PoolPeer:
    identity = node.identity.get()
    if identity is None:
        raise PeerRefused(INVALID)
    if recipient_mismatch(headers, identity.node_uuid):
        raise PeerRefused(INVALID, {REFUSAL_HEADER: REFUSAL_IDENTITY_MISMATCH})
    row = node.peers.by_node_uuid(headers["x-hub-pool-node"])
    if row is None or not row.peer_public_key:
        raise PeerRefused(INVALID)
    claimed = normalize_peer_fqdn(headers.get("x-hub-pool-peer"))
    if claimed is None:
        raise PeerRefused(INVALID)
    verdict = verify_headers(headers, method, path, body, sender_public_key_b64=row.peer_public_key,
                             recipient_uuid=identity.node_uuid, nonces=node.nonces,
                             now_ms=clock_ms(node.clock_offset_ms))
    if verdict.reason == "before_start":
        # genuinely signed, only signed before this node could know what it had spent: no
        # credential failure (the health tick reads a 503 as a strike, never a back-off)
        log.info("deferred a signed request from %s made before this node started", claimed)
        raise PeerRefused(NOT_YET, {"Retry-After": "5"}, status=503)
    if not verdict.ok:
        log.info("refused a signed request claiming %s: %s", claimed, verdict.reason)
        raise PeerRefused(INVALID)
    if claimed != row.node_fqdn:
        # identity beats address: recorded here, applied by the health tick (node_fqdn is UNIQUE)
        node.identity.note_observed_peer_fqdn(row.id, claimed)
    if row.signed_seen_at is None or row.bearer_grace_until is not None:
        # with the database down the stamp waits for the next signed request: admitting a
        # correctly signed peer does not depend on it
        row = node.peers.try_update(row.id, signed_seen_at=utcnow(), bearer_grace_until=None) or row
    return row


def _admit_bearer(node: Any, headers: dict[str, str]) -> PoolPeer:
    fqdn = normalize_peer_fqdn(headers.get("x-hub-pool-peer"))
    token = bearer(headers)
    if fqdn is None or token is None:
        raise PeerRefused(MISSING)
    if node.settings.current.poolRequireSignedPeers:
        raise PeerRefused(INVALID)
    row = node.peers.by_fqdn(fqdn)
    if row is None or not row.verify_token_hash:
        raise PeerRefused(UNKNOWN)
    if row.peer_public_key and row.signed_seen_at:
        raise PeerRefused(INVALID)  # no downgrade for a row seen signing
    if not tokens_match(token, row.verify_token_hash):
        raise PeerRefused(BAD_TOKEN)
    return row
