"""Throughput-aware placement (order 500) and much-faster placement (order 800, after the pin)
(spec: "Throughput-aware placement", "Much slower than a node as free"; protocol.md §4b
steps 7 and 10).

``ThroughputStage`` is the fourth split, nested inside the cap, ceiling and slot groups: a
candidate predicted to miss the request's budget moves behind the candidates of its group that
are not; then, for a prompt of 6144 tokens or more, an unmeasured peer gives way to a candidate
of its group with the same ranker score that is measured to meet the budget.

``SlowerPlacementStage`` looks at the node each group would try first and lets a node
predicted at least RATIO times as fast and FLOOR ms sooner, and no busier, go ahead of it;
then the new first is judged the same way, and so is the rest of the walk.

Both are off under ``HUB_POOL_THROUGHPUT_PLACEMENT=off|0|false`` (measuring goes on).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from hubpool_core import Stage
from hubpool_core.config import parse_decimal
from hubpool_core.models_ids import fold_model_id
from hubpool_core.placement import find_pin, pin_matches
from hubpool_core.placement.speed import SCRATCH_PREDICTED
from hubpool_core.placement.throughput import (
    DEFER_MIN_PROMPT_TOKENS,
    MIN_PROMPT_TOKENS,
    Prediction,
    advertised_prediction,
    combined,
    peer_snapshot_age_ms,
)
from hubpool_stages.splits import group_of, positive_int, split

ENV = "HUB_POOL_THROUGHPUT_PLACEMENT"
OFF_VALUES = frozenset({"off", "0", "false"})
RATIO_ENV = "HUB_POOL_SLOWER_PLACEMENT_RATIO"
FLOOR_ENV = "HUB_POOL_SLOWER_PLACEMENT_FLOOR_MS"
DEFAULT_RATIO = 3.0
DEFAULT_FLOOR_MS = 20_000.0
#: one request busier is allowed on a node that advertises a slot free for it
MAX_EXTRA_IN_FLIGHT = 1

#: ctx.scratch keys read here (written by the core or earlier stages)
SCRATCH_BUDGET = "budget_ms"
SCRATCH_HOLD = "affinity_hold"
SCRATCH_PINNED = "pinned_nodes"
SCRATCH_GAVE_WAY = "contention_gave_way"
#: ctx.scratch keys written here
SCRATCH_PREDICTIONS = "throughput_predictions"  # id(candidate) -> Prediction | None
SCRATCH_SECTION = "throughput_section"
SCRATCH_SLOW = "throughput_slow"  # candidates predicted to miss the budget

CPU_TIERS = frozenset({"cpu-only", "insufficient"})


def throughput_on(environ: Mapping[str, str] | None = None) -> bool:
    """On unless ``HUB_POOL_THROUGHPUT_PLACEMENT`` is ``off``, ``0`` or ``false``."""
    environ = os.environ if environ is None else environ
    return environ.get(ENV, "").strip().lower() not in OFF_VALUES


def _number(raw: str | None) -> float | None:
    # the core's one parser: ASCII digits only, no exponent, inf or nan
    return parse_decimal(raw)


def slower_settings(environ: Mapping[str, str] | None = None) -> tuple[float, float]:
    """(ratio, floor ms), read per request: the ratio when at least 1, the floor when at
    least 0, else their defaults (3, 20000)."""
    environ = os.environ if environ is None else environ
    ratio = _number(environ.get(RATIO_ENV))
    floor = _number(environ.get(FLOOR_ENV))
    return (ratio if ratio is not None and ratio >= 1 else DEFAULT_RATIO,
            floor if floor is not None and floor >= 0 else DEFAULT_FLOOR_MS)


def budget_of(node: Any, context: Any) -> float:
    """The request's budget: what the core put in ``ctx.scratch["budget_ms"]``, else the
    first-byte budget (the stricter), else the spec's defaults."""
    budget = context.scratch.get(SCRATCH_BUDGET)
    if isinstance(budget, (int, float)) and not isinstance(budget, bool) and budget > 0:
        return float(budget)
    budgets = getattr(node, "budgets", None)
    if budgets is not None and hasattr(budgets, "first_byte_ms"):
        return float(budgets.first_byte_ms(context.estimated_tokens))
    return float(max(300_000, math.ceil(context.estimated_tokens / 50) * 1000))


def predictions(node: Any, ranking: Sequence[Any], context: Any) -> dict[int, Prediction | None]:
    """Each candidate's prediction for this prompt (cached in the scratch): this node's own
    evidence for a local engine; for a peer, the slower of what this node timed and what the
    peer advertises."""
    cache = context.scratch.setdefault(SCRATCH_PREDICTIONS, {})
    store = getattr(node, "throughput", None)
    model = fold_model_id(context.model)
    tokens = context.estimated_tokens
    poll = getattr(context.settings, "poolHealthPollSeconds", 0) or 0
    for c in ranking:
        if id(c) in cache:
            continue
        if c.is_local:
            cache[id(c)] = store.predict("local", c.backend, model, tokens) if store is not None else None
            continue
        observed = store.predict(c.node, c.backend, model, tokens) if store is not None else None
        caps = getattr(c.peer, "last_capabilities", None)
        advertised = advertised_prediction(caps, c.backend, model, tokens, poll,
                                           snapshot_age_ms=peer_snapshot_age_ms(c.peer)) \
            if isinstance(caps, dict) else None
        cache[id(c)] = combined(observed, advertised)
    return cache


def _is_held(context: Any, candidate: Any) -> bool:
    return context.scratch.get(SCRATCH_HOLD) == (candidate.node, candidate.backend)


def _is_pinned(context: Any, candidate: Any) -> bool:
    """Named in ``ctx.scratch["pinned_nodes"]`` (node names or peer ids), or the target of
    the pin the settings hold for this model."""
    pinned = context.scratch.get(SCRATCH_PINNED) or ()
    if candidate.node in pinned or (candidate.peer_id is not None and candidate.peer_id in pinned):
        return True
    pins = getattr(context.settings, "poolPins", None)
    if not isinstance(pins, (list, tuple)) or not pins:
        return False
    try:
        pin = find_pin(list(pins), context.model)
        return pin is not None and pin_matches(pin, candidate)
    except Exception:  # noqa: BLE001 - a malformed pin pins nobody here
        return False


def _prior(candidate: Any) -> str:
    caps = getattr(candidate.peer, "last_capabilities", None)
    tier = caps.get("hardwareTier") if isinstance(caps, dict) else None
    return "cpu-only" if tier in CPU_TIERS else "unknown"


def _members_by(ranking: list[Any], key) -> dict[Any, list[int]]:
    slots: dict[Any, list[int]] = {}
    for at, cand in enumerate(ranking):
        slots.setdefault(key(cand), []).append(at)
    return slots


class ThroughputStage(Stage):
    """Demotes a candidate predicted to miss the budget within its group, and defers an
    unmeasured peer behind a same-score candidate measured to meet it (prompts of 6144 or
    more). Section ``throughput`` (``None`` when no candidate had applicable evidence):
    ``{estimatedTokens, budgetMs, estimates, unmeasured, slowerDemoted, overridden}``."""

    name = "throughput"
    section = "throughput"
    order = 500

    def enabled(self, context: Any) -> bool:
        """Judged routes only, unless ``HUB_POOL_THROUGHPUT_PLACEMENT`` is off."""
        return bool(context.judged) and throughput_on()

    def apply(self, ranking: Sequence[Any], context: Any) -> tuple[list[Any], dict[str, Any] | None]:
        out = list(ranking)
        tokens = context.estimated_tokens
        if tokens < MIN_PROMPT_TOKENS:
            return out, None
        preds = predictions(self.node, out, context)
        if all(preds.get(id(c)) is None for c in out):
            return out, None
        budget = budget_of(self.node, context)
        slow = {id(c) for c in out if preds.get(id(c)) is not None and preds[id(c)].predicted_ms > budget}
        out, _ = split(out, context, lambda c: id(c) in slow, lambda c: id(c) not in slow)
        deferred: list[Any] = []
        if tokens >= DEFER_MIN_PROMPT_TOKENS:
            out, deferred = self._defer(out, context, preds, slow)
        estimates = []
        for c in out:
            p = preds.get(id(c))
            if p is None:
                continue
            estimates.append({"node": c.node, "backend": c.backend, "tokensPerSec": round(p.tokens_per_sec, 1),
                              "fromPromptTokens": p.from_prompt_tokens, "extrapolated": p.extrapolated,
                              "predictedMs": int(round(p.predicted_ms)), "source": p.source,
                              "deadline": p.deadline, "slow": id(c) in slow})
        section = {"estimatedTokens": tokens, "budgetMs": int(budget), "estimates": estimates,
                   "unmeasured": [{"node": c.node, "backend": c.backend, "prior": _prior(c)} for c in deferred],
                   "slowerDemoted": [], "overridden": False}
        context.scratch[SCRATCH_SECTION] = section
        context.scratch[SCRATCH_SLOW] = [c for c in out if id(c) in slow]
        return out, section

    def _defer(self, out: list[Any], context: Any, preds: dict[int, Prediction | None],
               slow: set[int]) -> tuple[list[Any], list[Any]]:
        """Within each group and ranker score: unmeasured peers (never a local engine, the
        affinity-held engine or a pinned peer) go right behind the last candidate measured to
        meet the budget, an ``unknown`` prior ahead of a ``cpu-only`` one. A peer the
        predicted-TTFT stage priced (from the speed it advertises, or this node's timing) is
        not unmeasured: deferred, it undid that stage's order, and an equal box's first 7,600-token
        prompt that peer would have read in 5 s waited 12 s on a full local engine instead."""
        priced = context.scratch.get(SCRATCH_PREDICTED) or {}

        def fast(c: Any) -> bool:
            return preds.get(id(c)) is not None and id(c) not in slow

        def deferrable(c: Any) -> bool:
            return (preds.get(id(c)) is None and priced.get(id(c)) is None and not c.is_local
                    and not _is_held(context, c) and not _is_pinned(context, c))

        result = list(out)
        moved: list[Any] = []
        for positions in _members_by(out, lambda c: (group_of(context, c), c.score)).values():
            members = [out[at] for at in positions]
            last_fast = max((i for i, c in enumerate(members) if fast(c)), default=None)
            if last_fast is None:
                continue
            going = [c for c in members[:last_fast] if deferrable(c)]
            if not going:
                continue
            going = [c for c in going if _prior(c) == "unknown"] + [c for c in going if _prior(c) != "unknown"]
            staying = [c for c in members if not any(c is g for g in going)]
            at_fast = next(i for i, c in enumerate(staying) if c is members[last_fast])
            ordered = staying[:at_fast + 1] + going + staying[at_fast + 1:]
            for at, cand in zip(positions, ordered, strict=True):
                result[at] = cand
            moved.extend(going)
        moved.sort(key=lambda c: result.index(c))
        return result, moved

    def placed(self, context: Any, candidate: Any) -> None:
        """The walk tries a node predicted to miss the budget first: placed anyway."""
        self._reached(context, candidate)

    def failed_over(self, context: Any, candidate: Any) -> None:
        self._reached(context, candidate)

    def _reached(self, context: Any, candidate: Any) -> None:
        section = context.scratch.get(SCRATCH_SECTION)
        if section is not None and any(candidate is c for c in context.scratch.get(SCRATCH_SLOW) or ()):
            section["overridden"] = True


class SlowerPlacementStage(Stage):
    """After the pin: within each group, a node predicted much faster than the one in front
    goes ahead of it (prompts of 6144 or more). Writes ``slowerDemoted`` into the
    ``throughput`` section the throughput stage left, and returns that same section, so the
    routing-log row carries one ``throughput`` section."""

    name = "slower_placement"
    section = "throughput"
    order = 800

    def enabled(self, context: Any) -> bool:
        """Judged routes only, unless ``HUB_POOL_THROUGHPUT_PLACEMENT`` is off."""
        return bool(context.judged) and throughput_on()

    def slots_of(self, candidate: Any, context: Any) -> int | None:
        """The slot count the candidate's node states for an engine that counts slots."""
        if candidate.is_local:
            engine = getattr(candidate.local, "engine", None)
            if not getattr(engine, "states_slots", False):
                return None
            return positive_int(getattr(context.settings, "ollamaSlots", None))
        engines = getattr(self.node, "engine_by_kind", None) or {}
        if not getattr(engines.get(candidate.backend), "states_slots", False):
            return None
        caps = getattr(candidate.peer, "last_capabilities", None)
        return positive_int(caps.get("ollamaSlots")) if isinstance(caps, dict) else None

    def apply(self, ranking: Sequence[Any], context: Any) -> tuple[list[Any], dict[str, Any] | None]:
        out = list(ranking)
        section = context.scratch.get(SCRATCH_SECTION)
        if context.estimated_tokens < DEFER_MIN_PROMPT_TOKENS:
            return out, section
        preds = predictions(self.node, out, context)
        if all(preds.get(id(c)) is None for c in out):
            return out, section
        ratio, floor = slower_settings()
        gave_way = context.scratch.get(SCRATCH_GAVE_WAY) or []
        moves: list[dict[str, Any]] = []
        result = list(out)
        withheld = getattr(context, "withheld", None) or (lambda c: False)
        for positions in _members_by(out, lambda c: group_of(context, c)).values():
            members = [out[at] for at in positions]
            # withheld engines go last after this stage: the walk judges the others, in order,
            # so the node judged first is the first one not withheld and none is brought forward
            held = [c for c in members if withheld(c)]
            ordered = self._walk([c for c in members if not withheld(c)], context, preds, ratio, floor, gave_way,
                                 moves) + held
            for at, cand in zip(positions, ordered, strict=True):
                result[at] = cand
        if section is not None:
            section.setdefault("slowerDemoted", []).extend(moves)
        return result, section

    def _walk(self, members: list[Any], context: Any, preds: dict[int, Prediction | None], ratio: float,
              floor: float, gave_way: list[Any], moves: list[dict[str, Any]]) -> list[Any]:
        def frozen(c: Any) -> bool:
            return preds.get(id(c)) is None or _is_pinned(context, c) or _is_held(context, c)

        if not members or frozen(members[0]):
            return members  # unmeasured, pinned or held front: the walk stands as ranked

        def blocked(c: Any, rest: list[Any]) -> bool:
            """A local engine contention moved behind peers never comes back ahead of them."""
            before = rest[:next(i for i, x in enumerate(rest) if x is c)]
            for engine, behind in gave_way:
                if engine is c and any(b is x for b in behind or () for x in before):
                    return True
            return False

        def qualifies(c: Any, head: Any, ref: int, rest: list[Any]) -> bool:
            pc, ph = preds.get(id(c)), preds.get(id(head))
            if pc is None or ph is None or pc.deadline:
                return False
            if ph.predicted_ms < ratio * pc.predicted_ms or ph.predicted_ms - pc.predicted_ms < floor:
                return False
            if c.in_flight > ref:
                slots = self.slots_of(c, context)
                if not (c.in_flight <= ref + MAX_EXTRA_IN_FLIGHT and slots is not None and slots > c.in_flight):
                    return False
            return not blocked(c, rest)

        out: list[Any] = []
        rest = list(members)
        first = True
        while rest:
            origin = head = rest[0]
            if not frozen(head):
                while True:
                    ref = min(origin.in_flight, head.in_flight)
                    ahead = [c for c in rest[1:] if qualifies(c, head, ref, rest)]
                    if not ahead:
                        break
                    if first:
                        ph, pf = preds[id(head)], preds[id(ahead[0])]
                        moves.append({"node": head.node, "backend": head.backend,
                                      "predictedMs": int(round(ph.predicted_ms)), "inFlight": head.in_flight,
                                      "fasterNode": ahead[0].node, "fasterBackend": ahead[0].backend,
                                      "fasterMs": int(round(pf.predicted_ms)), "fasterInFlight": ahead[0].in_flight})
                    rest = ahead + [c for c in rest if not any(c is a for a in ahead)]
                    head = rest[0]
            out.append(rest.pop(0))
            first = False
        return out


__all__ = ["SlowerPlacementStage", "ThroughputStage", "budget_of", "predictions", "slower_settings",
           "throughput_on"]
