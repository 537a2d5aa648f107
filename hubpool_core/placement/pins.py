"""Operator pins: prefer one node for a model, or by default (spec: Routing pins).

A pin only reorders: the pinned node's candidates move to the front and everyone else keeps
their order behind them; it never adds or removes a candidate.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from hubpool_core.models_ids import fold_model_id
from hubpool_core.placement.candidates import Candidate


@dataclass
class PinResult:
    ranking: list[Candidate]
    section: dict[str, Any] | None
    pin: Any | None = field(default=None)


def find_pin(pins: list[Any], model: str) -> Any | None:
    """A model pin wins over the default and they never stack; ids compare verbatim."""
    for pin in pins:
        if pin.scope == "model" and pin.model == model:
            return pin
    for pin in pins:
        if pin.scope == "default":
            return pin
    return None


def local_target_available(model: str | None, backends: Sequence[Any],
                           unservable: Callable[[str, str], Collection[str]]) -> bool:
    """A local pin's ``targetAvailable`` (spec: "from the same predicates routing uses"): an
    engine here is healthy and lists the pinned model, and has not withheld it as unservable
    (``unservable``: (node, engine kind) -> the folded ids withheld there), as placement
    leaves such an engine out of the candidates. A default pin (no model): any healthy engine."""
    if model is None:
        return any(b.healthy for b in backends)
    folded = fold_model_id(model)
    return any(b.healthy and b.lists(model) and folded not in unservable("local", b.engine.kind) for b in backends)


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
        for at, cand in zip(positions, ordered, strict=True):  # the same members, reordered
            out[at] = cand
    return PinResult(out, section, pin)


def pin_note(pin: Any) -> str:
    """The sentence the 502s add when a pin ordered the candidates: it is never the cause."""
    target = "this node" if pin.targetKind == "local" else f"peer {pin.targetPeerId}"
    return (f"A routing pin ({pin.scope} scope, prefer {target}) ordered the candidates; a pin only reorders, "
            "and is not what caused this.")
