"""Who could serve a request, in base-rank order (spec: Ranking; protocol.md §4).

Candidates are this node's healthy engines holding the model plus every usable peer's
cached inventory. The base ranker orders them by queue depth — the proxy's own counts —
with the local head start, the pressure band only when weighted, and the hardware tier
for ties. Pure functions of a snapshot: nothing here does I/O.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from hubpool_core.models_ids import same_model
from hubpool_core.peering.peers import aware
from hubpool_core.placement.load import Load
from hubpool_core.signals.local_engines import LocalBackend
from hubpool_core.signals.pressure_bands import UNKNOWN_PRESSURE, read_band
from hubpool_core.store import PoolPeer

TIER_RANK = {"high": 0, "medium": 1, "low": 2, "cpu-only": 3, "insufficient": 4}
UNKNOWN_TIER_RANK = TIER_RANK["low"]
LOCAL_TIER_RANK = -1
#: a peer snapshot older than this many health polls is discarded: the peer ranks as mid-load
CAPABILITIES_FRESHNESS_POLLS = 3


@dataclass
class Candidate:
    """One place a request could run: a local engine, or a peer and the engine it named."""

    node: str  # "local" or the peer's FQDN
    backend: str  # the engine kind
    local: LocalBackend | None = None
    peer: PoolPeer | None = None
    score: float = 0.0
    tier_rank: int = LOCAL_TIER_RANK
    pressure: int = 1
    in_flight: int = 0

    @property
    def is_local(self) -> bool:
        return self.local is not None

    @property
    def peer_id(self) -> str | None:
        return self.peer.id if self.peer is not None else None


def is_fresh(peer: PoolPeer, poll_seconds: int, now: float | None = None) -> bool:
    seen = aware(peer.last_seen_at)
    if seen is None:
        return False
    now = now if now is not None else time.time()
    return now - seen.timestamp() <= poll_seconds * CAPABILITIES_FRESHNESS_POLLS


def peer_offers(peer: PoolPeer, model: str) -> str | None:
    """The first healthy backend in a peer's snapshot that lists the model, or None."""
    caps = peer.last_capabilities
    if not isinstance(caps, dict) or caps.get("acceptingWork") is False:
        return None
    for backend in caps.get("backends") or []:
        if backend.get("healthy") and any(same_model(m, model) for m in backend.get("modelsLoaded") or []):
            return backend.get("type")
    return None


def usable_peers(peers: list[PoolPeer], outbound: bool) -> list[PoolPeer]:
    if not outbound:
        return []
    return [p for p in peers if p.status == "connected" and p.enabled is not False]


def build_candidates(model: str, local: list[LocalBackend], peers: list[PoolPeer], load: Load, *,
                     local_affinity: int, pressure_weight: int, poll_seconds: int,
                     local_pressure: int | None = None) -> list[Candidate]:
    """Candidates in base-rank order (stable: local first, then peers in table order on ties)."""
    out: list[Candidate] = []
    for b in local:
        if b.healthy and b.lists(model):
            # a snapshot built without the field (older callers, test doubles) reports nothing
            reported = getattr(b.snapshot.result, "queue_depth", None)
            depth = load.local + load.engine_external(b.engine.kind, reported)
            out.append(Candidate("local", b.engine.kind, local=b, score=depth, in_flight=depth))
    now = time.time()
    for p in peers:
        backend = peer_offers(p, model)
        if backend is None:
            continue
        caps = p.last_capabilities or {}
        fresh = is_fresh(p, poll_seconds, now)
        reported = caps.get("inFlightRequests") if fresh else None
        reported = reported if isinstance(reported, int) and not isinstance(reported, bool) and reported >= 0 else None
        in_flight = load.peer_load(p.id, reported)
        band = read_band(caps.get("gpuPressure")) if fresh else None
        # absent, stale or invalid is mid-band; what we forwarded there floors a claimed 0
        pressure = max(UNKNOWN_PRESSURE if band is None else band, min(3, load.forwarded.get(p.id, 0)))
        stated = caps.get("hardwareTier")
        tier = TIER_RANK.get(stated, UNKNOWN_TIER_RANK) if isinstance(stated, str) else UNKNOWN_TIER_RANK
        out.append(Candidate(p.node_fqdn, backend, peer=p,
                             score=in_flight + pressure_weight * pressure + local_affinity,
                             tier_rank=tier, pressure=pressure, in_flight=in_flight))
    for c in out:
        if c.is_local:
            c.pressure = UNKNOWN_PRESSURE if local_pressure is None else local_pressure
            c.score += pressure_weight * c.pressure
    if pressure_weight:
        out.sort(key=lambda c: (c.score, c.pressure, c.tier_rank))
    else:  # the pressure key does not exist in the comparator while the weight is 0
        out.sort(key=lambda c: (c.score, c.tier_rank))
    return out
