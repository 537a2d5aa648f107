"""Outbound calls to peers: where a peer is dialled, and which credential goes with it.

Peers are dialled at https://<fqdn>; HUB_POOL_PEER_URLS maps names to other base URLs so
several nodes can share one machine. ``auth_headers`` is the single place credentials are
attached (protocol.md §2e "Outbound credential choice"). httpx is fine for the control
calls; the busy load poll, which asks every peer its in-flight count every poolLoadPollMs
while the node is busy, goes through aiohttp (:meth:`PeerClient.get_fast`): through httpx it
took more of a busy node's event loop than serving its requests did.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import httpx

from hubpool_core.peering.peers import aware, open_token
from hubpool_core.peering.signing import clock_ms, sign_headers
from hubpool_core.probe_http import FastAnswer, ProbeClient
from hubpool_core.store import PoolPeer

log = logging.getLogger("hubpool.peers")

HANDSHAKE_TIMEOUT_S = 10.0


class PeerAuthError(Exception):
    """No credential can be presented to this peer; ``status`` is what the operator route answers."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class PeerClient:
    def __init__(self, node: Any):
        self.node = node
        self._http: ProbeClient | None = None

    @property
    def http(self) -> ProbeClient:
        if self._http is None:
            self._http = ProbeClient(timeout=HANDSHAKE_TIMEOUT_S)
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()

    def base_url(self, fqdn: str) -> str:
        return self.node.peer_urls.get(fqdn) or f"https://{fqdn}"

    def _holding_back(self, row: PoolPeer, prefer_signed: bool) -> bool:
        """During the upgrade's grace window the side that learned the key from a request
        keeps presenting its bearer: it cannot know its own reply arrived."""
        grace = aware(row.bearer_grace_until)
        return (grace is not None and grace > datetime.now(UTC) and bool(row.present_token_encrypted)
                and not self.node.settings.current.poolRequireSignedPeers and not prefer_signed)

    async def auth_headers(self, row: PoolPeer, method: str, path: str, body: Any,
                           prefer_signed: bool = False, bearer_only: bool = False) -> dict[str, str]:
        identity = self.node.identity.get()
        self_fqdn = await self.node.tailnet.self_fqdn()
        if (not bearer_only and identity is not None and identity.signing_key is not None and row.peer_node_uuid
                and row.peer_public_key and not self._holding_back(row, prefer_signed)):
            return sign_headers(identity, method, path, identity.node_uuid, self_fqdn, row.peer_node_uuid, body,
                                now_ms=clock_ms(self.node.clock_offset_ms))
        if self.node.settings.current.poolRequireSignedPeers:
            raise PeerAuthError(403, f"This node requires signed pool peers and cannot yet sign requests to "
                                     f"{row.node_fqdn}")
        if not row.present_token_encrypted:
            raise PeerAuthError(503, f"No outbound pairing token stored for {row.node_fqdn}")
        try:
            token = open_token(self.node.node_secret(), row.node_fqdn, row.present_token_encrypted)
        except Exception as exc:  # noqa: BLE001 - an unreadable seal is an operator problem, said plainly
            raise PeerAuthError(503, f"The pairing token for {row.node_fqdn} could not be decrypted "
                                     f"(node secret changed?): {type(exc).__name__}") from None
        return {"X-Hub-Pool-Peer": self_fqdn or "", "Authorization": f"Bearer {token}"}

    async def call(self, row: PoolPeer, method: str, path: str, body: Any = None, *,
                   timeout: float = HANDSHAKE_TIMEOUT_S, prefer_signed: bool = False,
                   fallback_to_bearer: bool = False) -> httpx.Response:
        """An authenticated control call. With ``fallback_to_bearer``, a 401/403 to a signed
        attempt is retried with the bearer while one is still allowed (the approve flow)."""
        headers = await self.auth_headers(row, method, path, body, prefer_signed=prefer_signed)
        answer = await self._send(row.node_fqdn, method, path, body, headers, timeout)
        if (fallback_to_bearer and answer.status_code in (401, 403) and "X-Hub-Pool-Node" in headers
                and row.present_token_encrypted and not self.node.settings.current.poolRequireSignedPeers):
            bearer = await self.auth_headers(row, method, path, body, bearer_only=True)
            answer = await self._send(row.node_fqdn, method, path, body, bearer, timeout)
        return answer

    async def get_fast(self, row: PoolPeer, path: str, timeout: float) -> FastAnswer:
        """A signed GET read whole through aiohttp (status and body only): for calls made many
        times a second. Failures raise as httpx's would, as :meth:`call`'s do."""
        headers = await self.auth_headers(row, "GET", path, None)
        return await self.http.fast_get(self.base_url(row.node_fqdn) + path, headers=headers, timeout=timeout)

    async def _send(self, fqdn: str, method: str, path: str, body: Any, headers: dict[str, str],
                    timeout: float) -> httpx.Response:
        return await self.http.request(method, self.base_url(fqdn) + path, json=body if body is not None else None,
                                       headers=headers, timeout=timeout)

