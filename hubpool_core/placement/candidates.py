"""Who could serve a request, in base-rank order (spec: Ranking; protocol.md §4).

Candidates are this node's healthy engines holding the model plus every usable peer's
cached inventory. The base ranker orders them by queue depth — the proxy's own counts —
with the local head start, the pressure band only when weighted, and the hardware tier
for ties. Pure functions of a snapshot: nothing here does I/O.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from hubpool_core.engine import AGENT_DIALECTS, RERANK
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
    #: the engine serves the request's agent dialect natively (False: translated, or unknown)
    native: bool = False

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


def peer_offers(peer: PoolPeer, model: str, dialect: str | None = None) -> str | None:
    """The first healthy backend in a peer's snapshot that lists the model, or None.

    For an agent ``dialect`` a backend that states it serves it natively goes first, and for
    rerank (which has no translation) a backend that states dialects without it is no offer;
    a backend stating none (an older build, or unknown) is offered as before."""
    found = peer_backend(peer, model, dialect)
    return found[0] if found else None


def peer_backend(peer: PoolPeer, model: str, dialect: str | None = None) -> tuple[str, bool] | None:
    """(engine kind, serves ``dialect`` natively) of the backend :func:`peer_offers` picks."""
    caps = peer.last_capabilities
    if not isinstance(caps, dict) or caps.get("acceptingWork") is False:
        return None
    offers = []
    for backend in caps.get("backends") or []:
        if backend.get("healthy") and any(same_model(m, model) for m in backend.get("modelsLoaded") or []):
            stated = backend.get("dialects")
            native = isinstance(stated, list) and dialect in stated
            if dialect == RERANK and isinstance(stated, list) and not native:
                continue
            offers.append((backend.get("type"), native))
    if dialect in AGENT_DIALECTS:
        offers.sort(key=lambda o: not o[1])  # native first; stable otherwise
    return offers[0] if offers else None


def usable_peers(peers: list[PoolPeer], outbound: bool) -> list[PoolPeer]:
    if not outbound:
        return []
    return [p for p in peers if p.status == "connected" and p.enabled is not False]


def build_candidates(model: str, local: list[LocalBackend], peers: list[PoolPeer], load: Load, *,
                     local_affinity: int, pressure_weight: int, poll_seconds: int,
                     local_pressure: int | None = None, dialect: str | None = None) -> list[Candidate]:
    """Candidates in base-rank order (stable: local first, then peers in table order on ties).

    For an agent ``dialect``, engines serving it natively go before translating ones of the
    same score, and rerank goes only to engines that serve it (or a peer's that states nothing)."""
    out: list[Candidate] = []
    for b in local:
        if dialect == RERANK and RERANK not in b.dialects:
            continue  # no translation exists for rerank
        if b.healthy and b.lists(model):
            # a snapshot built without the field (older callers, test doubles) reports nothing
            reported = getattr(b.snapshot.result, "queue_depth", None)
            depth = load.local + load.engine_external(b.engine.kind, reported)
            out.append(Candidate("local", b.engine.kind, local=b, score=depth, in_flight=depth,
                                 native=dialect in AGENT_DIALECTS and dialect in b.dialects))
    now = time.time()
    for p in peers:
        offered = peer_backend(p, model, dialect)
        if offered is None:
            continue
        backend, native = offered
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
                             tier_rank=tier, pressure=pressure, in_flight=in_flight, native=native))
    for c in out:
        if c.is_local:
            c.pressure = UNKNOWN_PRESSURE if local_pressure is None else local_pressure
            c.score += pressure_weight * c.pressure
    # translating is the fallback: it only breaks ties, and only for the agent dialects
    agent = dialect in AGENT_DIALECTS
    if pressure_weight:
        out.sort(key=lambda c: (c.score, c.pressure, agent and not c.native, c.tier_rank))
    else:  # the pressure key does not exist in the comparator while the weight is 0
        out.sort(key=lambda c: (c.score, agent and not c.native, c.tier_rank))
    return out
