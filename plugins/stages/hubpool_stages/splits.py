"""The split stages: context caps (order 200), prompt ceilings (300) and slots (400)
(spec: "Context caps", "Prompt ceilings", "Slot-aware placement"; protocol.md §4b steps 4–6).

Each is a stable partition that nests inside the splits before it. A candidate the rule
judges against the request (capped below its window, over its ceiling, every slot full)
moves behind the candidates of its own group that the rule judges for it; everyone keeps the
ranker's order within their side. Nothing is ever removed, and where a group has nobody the
rule judges for the request, nobody in it moves ("all over means nothing moves").

The groups live in ``context.scratch["groups"]`` as ``{id(candidate): tuple}``: each split
stable-sorts by (current group, own flag 0/1) and appends its flag to every candidate's
tuple, so later splits, contention and the pin work within the groups the earlier ones left.
A split that demotes nobody writes nothing. Tuples compare lexicographically, so sorting by
them keeps better groups first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hubpool_core import Stage
from hubpool_core.placement.speed import SCRATCH_PREDICTED

#: ctx.scratch key: id(candidate) -> group tuple (read by contention and the core's pin).
SCRATCH_GROUPS = "groups"


def positive_int(value: Any) -> int | None:
    """``value`` when it is a whole number above 0 (``True`` is not one), else ``None``."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def group_of(context: Any, candidate: Any) -> tuple:
    """The candidate's current group: ``()`` before any split wrote one."""
    groups = context.scratch.get(SCRATCH_GROUPS)
    value = groups.get(id(candidate)) if isinstance(groups, dict) else None
    if value is None:
        return ()
    return value if isinstance(value, tuple) else (value,)


def split(ranking: Sequence[Any], context: Any, against: Callable[[Any], bool],
          taker: Callable[[Any], bool]) -> tuple[list[Any], list[Any]]:
    """Demote, within each current group, the candidates ``against`` judges against the
    request, behind the rest of that group — but only in a group holding at least one
    candidate ``taker`` says can take it. Returns the new order and the demoted candidates
    (in the order they were given). Writes the groups only when somebody was demoted."""
    out = list(ranking)
    keys = {id(c): group_of(context, c) for c in out}
    bad = {id(c) for c in out if against(c)}
    served = {keys[id(c)] for c in out if id(c) not in bad and taker(c)}
    demoted = [c for c in out if id(c) in bad and keys[id(c)] in served]
    if not demoted:
        return out, []
    flag = {id(c): 0 for c in out}
    flag.update((id(c), 1) for c in demoted)
    out.sort(key=lambda c: (keys[id(c)], flag[id(c)]))
    groups = context.scratch.get(SCRATCH_GROUPS)
    if not isinstance(groups, dict):
        groups = context.scratch[SCRATCH_GROUPS] = {}
    for c in out:
        groups[id(c)] = keys[id(c)] + (flag[id(c)],)
    return out, demoted


def peer_capability(candidate: Any, key: str) -> int | None:
    """A positive whole number the peer's last snapshot states under ``key``, else None."""
    caps = getattr(candidate.peer, "last_capabilities", None)
    return positive_int(caps.get(key)) if isinstance(caps, dict) else None


def _unique(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each node once (a node's several local engines share one cap and one ceiling)."""
    out: list[dict[str, Any]] = []
    for entry in entries:
        if entry not in out:
            out.append(entry)
    return out


class _SplitStage(Stage):
    """What the three splits share: the demoted candidates, kept for the walk's observers,
    and ``overridden`` set on the section (kept by reference in the routing-log row) when
    the walk places the request on one of them, first or on failover."""

    def _keep(self, context: Any, section: dict[str, Any], demoted: list[Any]) -> None:
        context.scratch[self.name + "_demoted"] = (section, demoted)

    def placed(self, context: Any, candidate: Any) -> None:
        """The walk tries a demoted candidate first (something after the split put it there)."""
        self._reached(context, candidate)

    def failed_over(self, context: Any, candidate: Any) -> None:
        """Failover reached a demoted candidate: the demotion was overridden."""
        self._reached(context, candidate)

    def _reached(self, context: Any, candidate: Any) -> None:
        kept = context.scratch.get(self.name + "_demoted")
        if kept and any(candidate is c for c in kept[1]):
            kept[0]["overridden"] = True


class ContextCapStage(_SplitStage):
    """Moves a candidate whose context cap is below the request's window behind every
    candidate that can take the window (the outermost split).

    The window is ``options.num_ctx`` on the native routes (source ``request``), else the
    prompt estimate (``estimated``). A local candidate's cap is this node's ``maxNumCtx``; a
    peer's the ``maxNumCtx`` its snapshot advertises. Uncapped takes any window. Section
    ``contextCap`` (``None`` when no candidate has a cap): ``{numCtx, source, excluded:
    [{node, maxNumCtx}], overridden}``.
    """

    name = "context_cap"
    section = "contextCap"
    order = 200

    def enabled(self, context: Any) -> bool:
        """The chat and completion routes only."""
        return bool(context.judged)

    def cap_of(self, candidate: Any, context: Any) -> int | None:
        if candidate.is_local:
            return positive_int(getattr(context.settings, "maxNumCtx", None))
        return peer_capability(candidate, "maxNumCtx")

    def apply(self, ranking: Sequence[Any], context: Any) -> tuple[list[Any], dict[str, Any] | None]:
        out = list(ranking)
        caps = {id(c): self.cap_of(c, context) for c in out}
        if all(cap is None for cap in caps.values()):
            return out, None
        if context.num_ctx is not None:
            window, source = context.num_ctx, "request"
        else:
            window, source = context.estimated_tokens, "estimated"

        def below(c: Any) -> bool:
            return caps[id(c)] is not None and caps[id(c)] < window

        out, demoted = split(out, context, below, lambda c: True)
        section = {"numCtx": window, "source": source,
                   "excluded": _unique([{"node": c.node, "maxNumCtx": caps[id(c)]} for c in demoted]),
                   "overridden": False}
        self._keep(context, section, demoted)
        return out, section


class PromptCeilingStage(_SplitStage):
    """Moves a candidate whose prompt ceiling is below the request's estimate behind the
    rest of its context-cap group.

    This node's ceiling is ``HUB_POOL_MAX_PROMPT_TOKENS`` when valid, else
    ``poolMaxPromptTokens``; a peer's the ``maxPromptTokens`` it advertises. Section
    ``promptCeiling`` (``None`` when no candidate has a ceiling): ``{estimatedTokens,
    excluded: [{node, maxPromptTokens}], overridden}``.
    """

    name = "prompt_ceiling"
    section = "promptCeiling"
    order = 300

    def enabled(self, context: Any) -> bool:
        """The chat and completion routes only."""
        return bool(context.judged)

    def local_ceiling(self, context: Any) -> int | None:
        env = getattr(self.node, "env", None)
        if env is None:  # no node to read the environment from: the setting alone
            return positive_int(getattr(context.settings, "poolMaxPromptTokens", None))
        from hubpool_core.placement.handout import effective_ceiling

        return positive_int(effective_ceiling(env, context.settings)[0])

    def apply(self, ranking: Sequence[Any], context: Any) -> tuple[list[Any], dict[str, Any] | None]:
        out = list(ranking)
        local = self.local_ceiling(context) if any(c.is_local for c in out) else None
        ceilings = {id(c): local if c.is_local else peer_capability(c, "maxPromptTokens") for c in out}
        if all(ceiling is None for ceiling in ceilings.values()):
            return out, None
        estimate = context.estimated_tokens

        def over(c: Any) -> bool:
            return ceilings[id(c)] is not None and ceilings[id(c)] < estimate

        out, demoted = split(out, context, over, lambda c: True)
        section = {"estimatedTokens": estimate,
                   "excluded": _unique([{"node": c.node, "maxPromptTokens": ceilings[id(c)]} for c in demoted]),
                   "overridden": False}
        self._keep(context, section, demoted)
        return out, section


class SlotsStage(_SplitStage):
    """With ``poolSlotAwareness`` on, moves a candidate whose every stated slot is taken
    behind the candidates of its group that still have a free one.

    Only engines whose concurrency is a slot count (``Engine.states_slots``) are judged, by
    the count their node states: this node's ``ollamaSlots``, a peer's advertised
    ``ollamaSlots``. Full is ``inFlight >= slots`` on the ranker's queue depth. Unstated is
    neither full nor free and keeps its place. Judged on every route that takes a slot
    (embeddings included); the ``show`` lookup is exempt. Section ``slots`` (``None`` when no
    candidate stated a count): ``{demoted: [{node, backend, inFlight, slots}], overridden}``.

    With predicted time to first token on (``poolTtftRanking``, hubpool's own), a full
    candidate whose prediction — its queue wait included — is sooner than every free
    candidate's of its group keeps its place: waiting there beats starting elsewhere (a warm
    node's short queue against a cold load). The section then lists it under ``kept``
    (``[{node, backend, inFlight, slots, predictedMs}]``, present only when not empty). With
    the ranking off nothing is predicted and the split is the spec's exactly.
    """

    name = "slots"
    section = "slots"
    order = 400

    def enabled(self, context: Any) -> bool:
        """On while ``poolSlotAwareness`` is above 0, on every route but ``show``."""
        return int(getattr(context.settings, "poolSlotAwareness", 0) or 0) > 0 and context.route_class != "show"

    def states_slots(self, candidate: Any) -> bool:
        if candidate.is_local:
            return bool(getattr(candidate.local.engine, "states_slots", False))
        engines = getattr(self.node, "engine_by_kind", None) or {}
        return bool(getattr(engines.get(candidate.backend), "states_slots", False))

    def slots_of(self, candidate: Any, context: Any) -> int | None:
        if not self.states_slots(candidate):
            return None
        if candidate.is_local:
            return positive_int(getattr(context.settings, "ollamaSlots", None))
        return peer_capability(candidate, "ollamaSlots")

    def apply(self, ranking: Sequence[Any], context: Any) -> tuple[list[Any], dict[str, Any] | None]:
        out = list(ranking)
        slots = {id(c): self.slots_of(c, context) for c in out}
        if all(n is None for n in slots.values()):
            return out, None

        def full(c: Any) -> bool:
            return slots[id(c)] is not None and c.in_flight >= slots[id(c)]

        def free(c: Any) -> bool:
            return slots[id(c)] is not None and c.in_flight < slots[id(c)]

        kept = _sooner_than_every_free(out, context, full, free)
        out, demoted = split(out, context, lambda c: full(c) and id(c) not in kept, free)
        section: dict[str, Any] = {"demoted": [{"node": c.node, "backend": c.backend, "inFlight": c.in_flight,
                                                "slots": slots[id(c)]} for c in demoted],
                                   "overridden": False}
        if kept:
            section["kept"] = [{"node": c.node, "backend": c.backend, "inFlight": c.in_flight,
                                "slots": slots[id(c)], "predictedMs": kept[id(c)]} for c in out if id(c) in kept]
        self._keep(context, section, demoted)
        return out, section


def _sooner_than_every_free(ranking: list[Any], context: Any, full: Callable[[Any], bool],
                            free: Callable[[Any], bool]) -> dict[int, int]:
    """id -> predicted ms of the full candidates the predicted-TTFT stage says start sooner,
    their wait included, than every free candidate of their group (each of which it priced:
    an unmeasured free one is explored as the spec says). Empty when the stage did not run."""
    table = context.scratch.get(SCRATCH_PREDICTED)
    if not isinstance(table, dict):
        return {}
    out: dict[int, int] = {}
    for c in ranking:
        mine = table.get(id(c))
        if mine is None or not full(c):
            continue
        group = group_of(context, c)
        frees = [table.get(id(f)) for f in ranking if free(f) and group_of(context, f) == group]
        if frees and all(p is not None and mine < p for p in frees):
            out[id(c)] = mine
    return out
