"""A forward that must start soon or not at all (hubpool's own; docs/placement.md, "A peer that
cannot start a forward soon turns it back").

An entry node knows a peer's load up to a load poll old, and another entry node may have filled
the slot it reads as free. So it names, on the forward, how long the request may wait for a slot
there and still start before the next candidate would have served it:
``X-Hub-Pool-Start-Within-Ms``, the predicted wait plus the margin to the next prediction. A
leaf whose own slot clock puts its engine's first free slot further off answers 429, marked
``X-Hub-Pool-Refusal: busy`` and carrying its count and schedule, before its engine sees the
request; the walk goes on to the next candidate. The last candidate is never sent the header, so an app never
sees the refusal. Additive: a reference peer ignores the header and a reference entry node never
sends it; with ``poolTtftRanking`` 0 nothing is predicted and nothing is sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hubpool_core.config import whole_in_range
from hubpool_core.placement.slot_clock import MAX_FREE_MS
from hubpool_core.placement.speed import SCRATCH_PREDICTED, SCRATCH_WAIT

#: the request header naming the wait a forward may take on the peer's engine (ms)
HEADER = "x-hub-pool-start-within-ms"
#: ``X-Hub-Pool-Refusal`` on the leaf's 429
REFUSAL = "busy"


def allowances(context: Any, candidates: Sequence[Any]) -> dict[int, int]:
    """Candidate index -> the wait (ms) a forward may take there, for every peer before the last
    candidate whose prediction is known and has a predicted candidate after it: its predicted
    wait, plus how much sooner than the best later prediction it was predicted to serve."""
    scratch = getattr(context, "scratch", None) or {}
    predicted, waits = scratch.get(SCRATCH_PREDICTED) or {}, scratch.get(SCRATCH_WAIT) or {}
    out: dict[int, int] = {}
    best_after: float | None = None
    for i in range(len(candidates) - 1, -1, -1):  # from the back: the best later prediction so far
        cand = candidates[i]
        mine, wait = predicted.get(id(cand)), waits.get(id(cand))
        if i < len(candidates) - 1 and not cand.is_local and mine is not None and wait is not None \
                and best_after is not None:
            out[i] = min(MAX_FREE_MS, round(wait + max(0.0, best_after - mine)))
        if mine is not None:
            best_after = mine if best_after is None else min(best_after, mine)
    return out


def asked(headers: Any) -> int | None:
    """The allowance a forward names, validated (whole milliseconds, 0 to an hour); ``None`` when
    absent or malformed (then the forward is served as any other)."""
    return whole_in_range(headers.get(HEADER), 0, MAX_FREE_MS)


def wait_here(slot_clock: Any, kind: str, slots: int | None) -> float | None:
    """How long a forward arriving now would wait for a slot on this node's engine, by its slot
    clock (every request this node handed the engine, its own apps' and its peers'); ``None``
    when the engine states no slots or a request's length is unknown: then it cannot say, and
    the forward is served."""
    if not slots:
        return None
    free = slot_clock.free_in(kind, slots)
    return None if not free else free[0]
