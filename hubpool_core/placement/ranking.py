"""Placement: who could serve a request, in what order (spec: Ranking; protocol.md §4).

Candidates are this node's healthy engines holding the model plus every usable peer's
cached inventory. The base ranker orders them by queue depth — the proxy's own counts —
with the local head start, the pressure band only when weighted, and the hardware tier
for ties; an operator pin then moves its node to the front without removing anyone.
Pure functions of a snapshot: nothing here does I/O.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from hubpool_core.models_ids import fold_model_id, same_model
from hubpool_core.peering.peers import aware
from hubpool_core.signals.local_engines import LocalBackend
from hubpool_core.signals.pressure_bands import UNKNOWN_PRESSURE, read_band
from hubpool_core.store import PoolPeer

_log = logging.getLogger("hubpool.placement")

UNKNOWN_PEER_LOAD = 1
TIER_RANK = {"high": 0, "medium": 1, "low": 2, "cpu-only": 3, "insufficient": 4}
UNKNOWN_TIER_RANK = TIER_RANK["low"]
LOCAL_TIER_RANK = -1
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


class Load:
    """Queue depth as the proxy counts it: requests handed to an engine and not finished.

    A peer's depth is what this node forwarded it and has not finished reading, plus what
    its last snapshot counted beyond this node's own forwards at that moment.
    """

    def __init__(self) -> None:
        self.local = 0
        self.forwarded: dict[str, int] = {}
        self._forwarded_at_report: dict[str, int] = {}
        #: generations in flight on each local engine: engine kind -> {(model, num_ctx): count}
        self.local_work: dict[str, dict[tuple[str, int | None], int]] = {}

    def acquire(self, peer_id: str | None, work: tuple[str, str, int | None] | None = None) -> None:
        """Count a request handed to an engine. ``work`` is (engine kind, model, num_ctx)
        for a local engine, so contention can tell what that engine is generating."""
        if peer_id is None:
            self.local += 1
            if work is not None:
                slot = self.local_work.setdefault(work[0], {})
                slot[work[1:]] = slot.get(work[1:], 0) + 1
        else:
            self.forwarded[peer_id] = self.forwarded.get(peer_id, 0) + 1

    def release(self, peer_id: str | None, work: tuple[str, str, int | None] | None = None) -> None:
        if peer_id is None:
            self.local = max(0, self.local - 1)
            if work is not None:
                slot = self.local_work.get(work[0], {})
                left = slot.get(work[1:], 0) - 1
                if left > 0:
                    slot[work[1:]] = left
                else:
                    slot.pop(work[1:], None)
        else:
            self.forwarded[peer_id] = max(0, self.forwarded.get(peer_id, 0) - 1)

    def engine_external(self, kind: str, reported: int | None) -> int:
        """What a local engine reported running or waiting beyond this node's own requests
        on it: work that reached it directly. 0 when it reported nothing (the setting off,
        or an engine with no such figure), so the proxy's count stands alone."""
        if reported is None:
            return 0
        ours = sum(self.local_work.get(kind, {}).values())
        return max(0, reported - ours)

    def note_report(self, peer_id: str) -> None:
        """Called when a peer's snapshot arrives: what we had forwarded at that moment."""
        self._forwarded_at_report[peer_id] = self.forwarded.get(peer_id, 0)

    def peer_load(self, peer_id: str, reported: int | None) -> int:
        forwarded = self.forwarded.get(peer_id, 0)
        if reported is None:
            return max(forwarded, UNKNOWN_PEER_LOAD)  # unmeasured is never idle
        external = max(0, reported - self._forwarded_at_report.get(peer_id, 0))
        return forwarded + external


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
        tier = TIER_RANK.get(caps.get("hardwareTier"), UNKNOWN_TIER_RANK)
        out.append(Candidate(p.node_fqdn, backend, peer=p, score=in_flight + pressure_weight * pressure + local_affinity,
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


@dataclass
class PlacementContext:
    """What stages may read about one request. Built once per request by the core."""

    route: str
    route_class: str  # chat | completion | embeddings | show
    model: str
    body: dict[str, Any]
    estimated_tokens: int
    settings: Any
    #: options.num_ctx on the native routes, else None
    num_ctx: int | None = None
    #: the app's X-Hub-Pool-Session header when it passed the character rules
    session_header: str | None = None
    #: the chat and completion routes: the ones ceilings, caps and prompt-aware stages judge
    judged: bool = False
    #: response headers a stage wants on the answer (and on the 502), e.g. X-Hub-Pool-Affinity
    response_headers: dict[str, str] = field(default_factory=dict)
    #: what stages computed for the walk's observers (session keys and the like)
    scratch: dict[str, Any] = field(default_factory=dict)


JUDGED_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/api/chat", "/api/generate"})


def request_num_ctx(route: str, body: dict[str, Any]) -> int | None:
    """options.num_ctx, read only on the native routes (the OpenAI dialect carries none)."""
    if not route.startswith("/api/"):
        return None
    options = body.get("options")
    value = options.get("num_ctx") if isinstance(options, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def run_stages(stages: list[Any], ranking: list[Candidate], ctx: PlacementContext, pins: list[Any],
               withheld: Callable[[Candidate], bool] | None = None) -> tuple[list[Candidate], dict[str, Any]]:
    """The pipeline: stages in order, the pin at PIN_ORDER, withheld engines last.

    Returns the final order and every section written (``pin`` included). A stage whose
    ``enabled`` is false is not called; its section stays None. A stage that raises is
    skipped for this request (logged), never fatal to placement.
    """
    from hubpool_core.stage import PIN_ORDER

    sections: dict[str, Any] = {}
    pinned = False
    for stage in stages:
        if not pinned and stage.order >= PIN_ORDER:
            result = apply_pin(ranking, pins, ctx.model, ctx.scratch.get("groups"))
            ranking, sections["pin"], pinned = result.ranking, result.section, True
            ranking = _keep_contention_pieces(ranking, ctx)
        try:
            if not stage.enabled(ctx):
                continue
            before = list(ranking)
            ranking, section = stage.apply(ranking, ctx)
            ranking = list(ranking)
        except Exception:  # noqa: BLE001 - one bad stage must not break placement
            _log.exception("placement stage %s failed; skipped for this request", stage.name)
            continue
        if sorted(map(id, ranking)) != sorted(map(id, before)):
            _log.error("placement stage %s added or removed a candidate; its order is ignored", stage.name)
            ranking = before
            continue
        sections[stage.section] = section
    if not pinned:
        result = apply_pin(ranking, pins, ctx.model, ctx.scratch.get("groups"))
        ranking, sections["pin"] = result.ranking, result.section
        ranking = _keep_contention_pieces(ranking, ctx)
    if withheld is not None:
        ranking = [c for c in ranking if not withheld(c)] + [c for c in ranking if withheld(c)]
    return ranking, sections


def _keep_contention_pieces(ranking: list[Candidate], ctx: PlacementContext) -> list[Candidate]:
    """Pins apply within each piece contention left: a pinned engine that gave way to peers
    is not put back in front of them (spec: pins within each group)."""
    gave_way = ctx.scratch.get("contention_gave_way") or []
    for engine, behind in gave_way:
        if engine not in ranking or not behind:
            continue
        last = max((ranking.index(c) for c in behind if c in ranking), default=-1)
        if ranking.index(engine) < last:
            ranking = [c for c in ranking if c is not engine]
            ranking.insert(last, engine)  # just after the last candidate it gave way to
    return ranking


@dataclass
class PinResult:
    ranking: list[Candidate]
    section: dict[str, Any] | None
    pin: dict[str, Any] | None = field(default=None)


def find_pin(pins: list[Any], model: str) -> Any | None:
    """A model pin wins over the default and they never stack; ids compare verbatim."""
    for pin in pins:
        if pin.scope == "model" and pin.model == model:
            return pin
    for pin in pins:
        if pin.scope == "default":
            return pin
    return None


def pin_matches(pin: Any, candidate: Candidate) -> bool:
    if pin.targetKind == "local":
        return candidate.is_local
    return candidate.peer_id == pin.targetPeerId


def apply_pin(ranking: list[Candidate], pins: list[Any], model: str,
              groups: dict[int, Any] | None = None) -> PinResult:
    """Prefer-only: the pinned node's candidates move to the front, everyone else keeps
    their order behind them; a pin whose target has no candidate is a silent no-op.

    ``groups`` (``id(candidate) -> group``, what the split stages left in
    ``ctx.scratch["groups"]``): the pin applies within each group instead — the pinned
    node's candidates move to the front of their own group, and every group keeps the
    positions it holds, so a pin never brings a node out of a worse group."""
    pin = find_pin(pins, model)
    if pin is None:
        return PinResult(ranking, None)
    section = {"scope": pin.scope, "mode": pin.mode, "targetKind": pin.targetKind}
    front = [c for c in ranking if pin_matches(pin, c)]
    if not front:
        return PinResult(ranking, section, pin)
    if not groups:
        return PinResult(front + [c for c in ranking if not pin_matches(pin, c)], section, pin)
    slots: dict[Any, list[int]] = {}
    for at, cand in enumerate(ranking):
        slots.setdefault(groups.get(id(cand)), []).append(at)
    out = list(ranking)
    for positions in slots.values():
        members = [ranking[at] for at in positions]
        ordered = [c for c in members if pin_matches(pin, c)] + [c for c in members if not pin_matches(pin, c)]
        for at, cand in zip(positions, ordered):
            out[at] = cand
    return PinResult(out, section, pin)


# -- the auto alias --------------------------------------------------------------------

_NOT_CHAT = re.compile(r"embed|rerank|bge-|minilm|e5-", re.IGNORECASE)
_PARAMS = re.compile(r"(\d+(?:\.\d+)?)\s*b\b", re.IGNORECASE)
AUTO_MIN_PARAMS_B = 7


def _params_b(model: str) -> float | None:
    tag = model.rsplit("/", 1)[-1]
    found = _PARAMS.findall(tag.replace(":", " ").replace("-", " "))
    return float(found[-1]) if found else None


def choose_auto_model(offers: dict[str, set[str]], preferred: str | None) -> str | None:
    """offers: model id → the nodes serving it ("local" among them when this node does).

    Order: the operator's preferred model wherever it is served; else chat models only
    (never embeddings, rerankers or a :cloud tag), 7 B or more first, then parameter count,
    how many nodes serve it, whether this node does, and the id.
    """
    if preferred:
        for model in offers:
            if same_model(model, preferred):
                return model
    chat = [m for m in offers if not _NOT_CHAT.search(m) and not fold_model_id(m).endswith(":cloud")]
    if not chat:
        return None

    def key(m: str) -> tuple:
        params = _params_b(m)
        return (0 if params is not None and params >= AUTO_MIN_PARAMS_B else 1, -(params or 0), -len(offers[m]),
                0 if "local" in offers[m] else 1, m)

    return sorted(chat, key=key)[0]


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
