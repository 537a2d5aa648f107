"""Discoverable peers: merge what the directories name, then ask each name's ``/identify``.

``GET peers/discoverable`` (``hubpool discover``) answers one question: which unpaired nodes
can this Hub name? (spec "Where pairing candidates come from"). The steps, in order:

1. Ask every configured :class:`~hubpool_core.directory.Directory` for candidates,
   concurrently. The Admin API leg is skipped when this node is not on a tailnet (it is
   queried with the tailnet the daemon reports, so such a node enumerates nothing from it),
   and so is the daemon's own leg (its "Needs" column: Tailscale connected on this node). A
   directory that raises contributes nothing and the others still answer.
2. :func:`merge_candidates` folds them on the normalised FQDN; a tailnet entry wins.
3. Already-paired names and this node's own name are removed BEFORE anything is probed.
4. :func:`probe_identify` asks ``GET <peer_url(fqdn)>/api/inference/pool/identify`` of every
   remaining name, concurrently; only a node answering ``isCiHub`` is offered.

This is an operator action, never a poll: every call probes every unpaired candidate. A node
with no tailnet, no Admin API credential and no Portal registration makes zero network calls.
Names only: nothing here reads, stores or folds on a node UUID (spec "A claimed UUID is not an
identity" — /identify reports none, and a directory's device id is a display value).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass, replace
from typing import Any

import httpx

from hubpool_core.directory import Directory, DirectoryCandidate
from hubpool_core.peering.signing import normalize_peer_fqdn

log = logging.getLogger(__name__)

__all__ = [
    "IDENTIFY_PATH",
    "MIN_PAIR_BY_ADDRESS_PROTOCOL",
    "POOL_PROTOCOL_VERSION",
    "PROBE_TIMEOUT_S",
    "DiscoverablePeer",
    "discover",
    "https_peer_url",
    "merge_candidates",
    "probe_identify",
]

#: The unauthenticated identify route, under the global ``/api`` prefix (protocol.md §2a).
IDENTIFY_PATH = "/api/inference/pool/identify"
#: This build's pool protocol; ``/identify`` answers ``{"isCiHub": true, "poolProtocol": 2}``.
POOL_PROTOCOL_VERSION = 2
#: A Hub below this ignores the PIN and can never disclose its name, so pairing with it by
#: address cannot work (spec "Finding a peer by address"); pair by MagicDNS name instead.
MIN_PAIR_BY_ADDRESS_PROTOCOL = 2
#: ``DISCOVERY_PROBE_TIMEOUT_MS = 5_000`` (protocol.md §2d).
PROBE_TIMEOUT_S = 5.0
#: An /identify answer is a few dozen bytes; read no more than this of whatever answers.
_IDENTIFY_MAX_BYTES = 64 * 1024
#: Concurrent /identify probes in one discover() call; a large tailnet still finishes in a
#: few timeouts rather than opening hundreds of connections at once.
_MAX_CONCURRENT_PROBES = 32


@dataclass
class DiscoverablePeer:
    """One merged pairing candidate: the wire shape ``DiscoverablePoolPeer`` (protocol.md §2a).

    ``nodeFqdn`` is the normalised name (:func:`~hubpool_core.peering.signing.normalize_peer_fqdn`),
    the one thing pairing uses. ``tailscaleDeviceId`` is the winning directory's device id,
    ``""`` when no directory had one (never absent on the wire); display only. ``hostname``
    is display only. ``source`` is ``None`` for a tailnet directory's entry and the directory
    name (``"portal"``) otherwise. ``os`` and ``online`` are display chips: ``None`` means no
    directory reported them, never "offline".
    """

    tailscaleDeviceId: str
    nodeFqdn: str
    hostname: str
    source: str | None = None
    os: str | None = None
    online: bool | None = None

    def as_json(self) -> dict[str, Any]:
        """The wire object: ``source`` only when not a tailnet entry, ``os`` and ``online``
        only when known."""
        out: dict[str, Any] = {
            "tailscaleDeviceId": self.tailscaleDeviceId,
            "nodeFqdn": self.nodeFqdn,
            "hostname": self.hostname,
        }
        if self.source is not None:
            out["source"] = self.source
        if self.os is not None:
            out["os"] = self.os
        if self.online is not None:
            out["online"] = self.online
        return out


def _peer_from(candidate: DirectoryCandidate, fqdn: str, tailnet_sources: Set[str]) -> DiscoverablePeer:
    hostname = candidate.hostname.strip() if isinstance(candidate.hostname, str) else ""
    device_id = candidate.device_id if isinstance(candidate.device_id, str) else ""
    return DiscoverablePeer(
        tailscaleDeviceId=device_id,
        nodeFqdn=fqdn,
        hostname=hostname or fqdn.split(".", 1)[0],
        source=None if candidate.source in tailnet_sources else str(candidate.source),
        os=candidate.os if isinstance(candidate.os, str) and candidate.os else None,
        online=candidate.online if isinstance(candidate.online, bool) else None,
    )


def _backfilled(winner: DiscoverablePeer, other: DiscoverablePeer) -> DiscoverablePeer:
    # Only what the winner lacks; its name, hostname and source are never replaced.
    return replace(
        winner,
        tailscaleDeviceId=winner.tailscaleDeviceId or other.tailscaleDeviceId,
        os=winner.os if winner.os is not None else other.os,
        online=winner.online if winner.online is not None else other.online,
    )


def merge_candidates(lists: Iterable[list[DirectoryCandidate]],
                     tailnet_sources: Set[str] = frozenset()) -> list[DiscoverablePeer]:
    """Fold every directory's candidates into one entry per node, sorted by ``nodeFqdn``.

    The fold key is :func:`~hubpool_core.peering.signing.normalize_peer_fqdn` of the candidate's name
    (``HUB-B.example.ts.net.`` and ``hub-b.example.ts.net`` are one node); a name that does not
    normalise — an IP literal, a scheme, a single label — is dropped, since it could never
    survive ``peers/pair``. Never folds on a UUID a far side claims: that would let a hostile
    box suppress a real node from the list (spec "Where pairing candidates come from").

    ``tailnet_sources`` names the directories whose ``is_tailnet`` is true (absence of
    ``source`` on the wire is the only encoding of their entries, spec).

    Precedence: a tailnet entry (source in ``tailnet_sources``) beats any other, because its
    name is the one the transport dials; among equals the first seen wins (``lists`` order,
    then list order). The winner keeps its own hostname and source; its device id, ``os`` and
    ``online`` are back-filled from the losers only where it has none.
    """
    merged: dict[str, DiscoverablePeer] = {}
    for candidates in lists:
        for candidate in candidates or ():
            if not isinstance(candidate, DirectoryCandidate):
                continue
            fqdn = normalize_peer_fqdn(candidate.node_fqdn)
            if fqdn is None:
                continue
            incoming = _peer_from(candidate, fqdn, tailnet_sources)
            held = merged.get(fqdn)
            if held is None:
                merged[fqdn] = incoming
            elif held.source is not None and incoming.source is None:
                merged[fqdn] = _backfilled(incoming, held)  # the tailnet entry takes over
            else:
                merged[fqdn] = _backfilled(held, incoming)
    return [merged[name] for name in sorted(merged)]


def _verdict(is_hub: bool, protocol: int | None, reason: str | None) -> dict[str, Any]:
    return {"isCiHub": is_hub, "poolProtocol": protocol, "reason": reason}


async def _read_capped(response: httpx.Response, limit: int) -> bytes | None:
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


def _protocol_of(body: Mapping[str, Any]) -> int:
    # Protocol 1 omits poolProtocol (protocol.md §2a). Anything that is not an integral
    # number is read the same way: a Hub that cannot say which protocol it speaks is treated
    # as the oldest one, which only ever makes address pairing refuse, never succeed.
    value = body.get("poolProtocol")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 1
    if isinstance(value, float) and not value.is_integer():
        return 1
    return int(value)


async def probe_identify(
    http: httpx.AsyncClient,
    base_url: str,
    timeout_s: float = PROBE_TIMEOUT_S,
    *,
    headers: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Ask ``GET <base_url>/api/inference/pool/identify`` whether a CI-Hub is there.

    Answers ``{"isCiHub": bool, "poolProtocol": int | None, "reason": str | None}``:

    - ``isCiHub`` true, ``reason`` None: a Hub on protocol ≥ :data:`MIN_PAIR_BY_ADDRESS_PROTOCOL`.
    - ``isCiHub`` true, ``reason`` ``"protocol_too_old"``: a Hub whose answer omits
      ``poolProtocol`` (protocol 1, reported as ``poolProtocol: 1``) or names one below 2. It
      can still be paired by MagicDNS name, so discovery offers it; pairing by address cannot
      work (it ignores the PIN).
    - ``isCiHub`` false, ``"not_a_hub"``: something answered, but not a Hub — a non-2xx status,
      a redirect (never followed), a body that is not a JSON object with ``isCiHub: true``, or
      one over 64 KiB. ``poolProtocol`` None.
    - ``isCiHub`` false, ``"unreachable"``: no HTTP answer within ``timeout_s`` (connection
      refused, DNS, TLS, timeout). ``poolProtocol`` None.

    ``timeout_s`` bounds the whole exchange, not only each read. ``headers`` is extra request
    headers (a ``Host`` naming the typed address when dialling a checked IP). No credential is
    ever sent. Never raises, except that cancelling the caller still cancels it.
    """
    url = base_url.rstrip("/") + IDENTIFY_PATH
    request_headers = {"Accept": "application/json"}
    if headers:
        request_headers.update(headers)

    async def exchange() -> dict[str, Any]:
        async with http.stream(
            "GET", url, headers=request_headers, timeout=timeout_s, follow_redirects=False
        ) as response:
            if not 200 <= response.status_code < 300:
                return _verdict(False, None, "not_a_hub")
            raw = await _read_capped(response, _IDENTIFY_MAX_BYTES)
        if raw is None:
            return _verdict(False, None, "not_a_hub")
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return _verdict(False, None, "not_a_hub")
        if not isinstance(body, dict) or body.get("isCiHub") is not True:
            return _verdict(False, None, "not_a_hub")
        protocol = _protocol_of(body)
        reason = None if protocol >= MIN_PAIR_BY_ADDRESS_PROTOCOL else "protocol_too_old"
        return _verdict(True, protocol, reason)

    try:
        return await asyncio.wait_for(exchange(), timeout_s)
    except TimeoutError:
        return _verdict(False, None, "unreachable")
    except Exception as exc:  # noqa: BLE001 - httpx errors, a bad URL, a socket error: never break the caller
        log.debug("identify probe of %s failed: %s", url, type(exc).__name__)
        return _verdict(False, None, "unreachable")


def https_peer_url(fqdn: str) -> str:
    """``https://<fqdn>``: where every peer is reached, over the tailnet (spec: the transport
    never changes, whichever directory named the node)."""
    return f"https://{fqdn}"


async def _listed(directory: Directory) -> list[DirectoryCandidate]:
    try:
        found = await directory.candidates()
    except Exception as exc:  # noqa: BLE001 - spec: a directory that fails contributes nothing
        log.debug("directory %s failed to list candidates: %r", getattr(directory, "name", directory), exc)
        return []
    return list(found) if isinstance(found, (list, tuple)) else []


def _consulted(directory: Directory, tailnet_connected: bool) -> bool:
    try:
        if not directory.configured():
            return False  # contract: an unconfigured directory makes no call at all
    except Exception as exc:  # noqa: BLE001 - a plugin's configured() that raises reads as unconfigured
        log.debug("directory %s could not say whether it is configured: %r", getattr(directory, "name", directory), exc)
        return False
    # spec: the Admin API is queried with the tailnet name the local daemon reports, so a node
    # that has not joined a tailnet enumerates nothing from it, however valid the credential.
    return tailnet_connected or not getattr(directory, "is_tailnet", False)


def _normalised_names(names: Iterable[str | None]) -> set[str]:
    out = set()
    for name in names:
        if not isinstance(name, str):
            continue
        out.add(normalize_peer_fqdn(name) or name.strip().rstrip(".").lower())
    return out


async def discover(
    directories: Iterable[Directory],
    *,
    exclude: set[str],
    self_fqdn: str | None,
    peer_url: Callable[[str], str] = https_peer_url,
    http: httpx.AsyncClient,
    tailnet_connected: bool,
    timeout_s: float = PROBE_TIMEOUT_S,
    max_concurrent_probes: int = _MAX_CONCURRENT_PROBES,
) -> dict[str, list[dict[str, Any]]]:
    """The discoverable-peers answer: ``{"peers": [...], "unanswered": [...]}``.

    ``directories`` are the registered directory instances; each whose ``configured()`` is
    true is asked, concurrently — except the tailnet directories (``is_tailnet``)
    when ``tailnet_connected`` is false. A directory that raises contributes nothing (debug
    log). The candidates are merged (:func:`merge_candidates`); every name in ``exclude``
    (the already-paired ``node_fqdn`` values) and ``self_fqdn`` (this node's own name, or
    None) is then dropped before any probe. Each remaining name is probed with
    :func:`probe_identify` at ``peer_url(fqdn)`` (default ``https://<fqdn>``; tests point it
    at loopback), at most ``max_concurrent_probes`` at a time, each within ``timeout_s``.

    ``peers`` lists ``DiscoverablePoolPeer`` objects (:meth:`DiscoverablePeer.as_json`) for
    the names that answered ``isCiHub`` — an old-protocol Hub included, since pairing by name
    works with it. ``unanswered`` lists ``{"nodeFqdn", "hostname", "os", "online",
    "reason"}`` for the rest (``reason`` ``"unreachable"`` or ``"not_a_hub"``; ``os`` and
    ``online`` None when unknown), which the empty state shows as "devices that did not answer
    as a Hub". Both are sorted by ``nodeFqdn``. Never raises for a directory or a peer.

    With no directory consulted, or none naming an unpaired device, no request is made.
    """
    consulted = [d for d in directories if _consulted(d, tailnet_connected)]
    lists = await asyncio.gather(*(_listed(d) for d in consulted)) if consulted else []

    # spec: already-paired names are excluded before probing, and so is this node itself.
    skip = _normalised_names([*exclude, self_fqdn])
    tailnet_sources = {d.name for d in consulted if getattr(d, "is_tailnet", False)}
    candidates = [peer for peer in merge_candidates(lists, tailnet_sources) if peer.nodeFqdn not in skip]
    if not candidates:
        return {"peers": [], "unanswered": []}

    gate = asyncio.Semaphore(max(1, max_concurrent_probes))

    async def probe(peer: DiscoverablePeer) -> dict[str, Any]:
        async with gate:
            try:
                base = peer_url(peer.nodeFqdn)
            except Exception as exc:  # noqa: BLE001 - a name with no URL is one unreachable peer, not a failed answer
                log.debug("no URL for %s: %r", peer.nodeFqdn, exc)
                return _verdict(False, None, "unreachable")
            return await probe_identify(http, base, timeout_s)

    verdicts = await asyncio.gather(*(probe(peer) for peer in candidates))
    peers: list[dict[str, Any]] = []
    unanswered: list[dict[str, Any]] = []
    for peer, verdict in zip(candidates, verdicts, strict=True):
        if verdict["isCiHub"]:
            peers.append(peer.as_json())
        else:
            unanswered.append({
                "nodeFqdn": peer.nodeFqdn,
                "hostname": peer.hostname,
                "os": peer.os,
                "online": peer.online,
                "reason": verdict["reason"],
            })
    return {"peers": peers, "unanswered": unanswered}
