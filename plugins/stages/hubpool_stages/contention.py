"""Local engine contention (spec: "Local engine contention"; protocol.md §4b step 8).

A local engine generating for work the request cannot join — another model, or on an
engine that loads a model per window the same model at another window — gives up the
``poolLocalAffinity`` head start: it moves behind the candidates right after it that are no
busier, and stops at the first busier one. It is demoted, never removed. The engine prefix
affinity holds keeps its place while the session's prefix can still be warm there.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from hubpool_core import Stage
from hubpool_core.models_ids import same_model

log = logging.getLogger("hubpool.stages.contention")

ENV = "HUB_POOL_CONTENTION_PLACEMENT"
OFF_VALUES = frozenset({"off", "0", "false"})

#: ctx.scratch keys read here: the engine prefix affinity qualified (written by the affinity
#: stage), the residency the core read (engine kind -> resident model ids, or None when it
#: could not tell), and optional placement groups (id(candidate) -> group) a move never crosses.
SCRATCH_HOLD = "affinity_hold"
SCRATCH_RESIDENT = "resident"
SCRATCH_GROUPS = "groups"
#: ctx.scratch keys written here: the section (settled by the observers) and, for the pin,
#: each engine that gave way with the candidates it gave way to.
SCRATCH_SECTION = "contention_section"
SCRATCH_GAVE_WAY = "contention_gave_way"


def contention_on(environ: Mapping[str, str]) -> bool:
    """On unless ``HUB_POOL_CONTENTION_PLACEMENT`` is ``off``, ``0`` or ``false``."""
    return environ.get(ENV, "").strip().lower() not in OFF_VALUES


def windowed(candidate: Any) -> bool:
    """Whether the engine loads a model per window (num_ctx is a load parameter), so the
    same model at another window is work the request cannot join."""
    return bool(getattr(candidate.local.engine, "renders_own_template", False))


def resolve_window(candidate: Any, context: Any, model: str, named: int | None) -> int | None:
    """The window ``model`` runs at on this local engine for a request naming ``named``.

    A windowed engine runs the named window, else this node's stated default
    (``maxNumCtx``); any other engine runs the window its own listing states for the
    model. ``None``: the request named none and nothing states a default.
    """
    if windowed(candidate):
        return named if named is not None else getattr(context.settings, "maxNumCtx", None)
    snapshot = getattr(candidate.local, "snapshot", None)
    for info in getattr(getattr(snapshot, "result", None), "models", None) or ():
        if same_model(info.id, model):
            return getattr(info, "context_window", None)
    return None


def blocking_work(candidate: Any, context: Any, load: Any) -> list[dict[str, Any]]:
    """What a local engine is generating that the request cannot join, as
    ``[{model, numCtx}]`` with each window resolved as the engine runs it; empty when the
    engine is idle or busy only with work the request joins."""
    work = (getattr(load, "local_work", None) or {}).get(candidate.backend) or {}
    runs_at = resolve_window(candidate, context, context.model, context.num_ctx)
    busy: list[dict[str, Any]] = []
    for (model, named), count in work.items():
        if count <= 0:
            continue
        at = resolve_window(candidate, context, model, named)
        if same_model(model, context.model) and (not windowed(candidate) or at == runs_at):
            continue
        entry = {"model": model, "numCtx": at}
        if entry not in busy:
            busy.append(entry)
    return busy


def reloaded_for_another_window(candidate: Any, context: Any, load: Any) -> bool:
    """Whether the requested model is generating on this windowed engine at another
    window: the runner was reloaded for that request, which discarded the prefix."""
    if not windowed(candidate):
        return False
    runs_at = resolve_window(candidate, context, context.model, context.num_ctx)
    work = (getattr(load, "local_work", None) or {}).get(candidate.backend) or {}
    return any(count > 0 and same_model(model, context.model)
               and resolve_window(candidate, context, model, named) != runs_at
               for (model, named), count in work.items())


def cold_reason(candidate: Any, context: Any, load: Any) -> str | None:
    """Why the session's prefix cannot still be warm on this local engine, or ``None``
    when it can: the model generating there at another window, or the engine not showing
    the model resident (unknown counts as not shown: a warm prefix has to be shown). An
    engine with no residency API is read by its inventory, which made it a candidate."""
    if reloaded_for_another_window(candidate, context, load):
        return "the model is generating there at another window"
    if not getattr(candidate.local.engine, "has_residency", False):
        return None
    resident = (context.scratch.get(SCRATCH_RESIDENT) or {}).get(candidate.backend)
    if not isinstance(resident, (list, tuple)):
        return "its residency could not be read within the placement budget"
    if not any(same_model(getattr(r, "id", r), context.model) for r in resident):
        return "the engine does not show the model resident"
    return None


class LocalContentionStage(Stage):
    """Moves a contended local engine behind the following candidates no busier than it.

    Section ``contention`` (``None`` when no local engine was contended): ``{numCtx,
    demoted: [{node, backend, busyWith: [{model, numCtx}], runsAt, behind, overriddenBy}],
    overridden}``; ``overridden`` turns true when the walk reaches an engine that gave way.
    """

    name = "local_contention"
    section = "contention"
    order = 600

    def enabled(self, context: Any) -> bool:
        """On for the judged routes unless HUB_POOL_CONTENTION_PLACEMENT turns it off (read
        per request)."""
        return bool(context.judged) and contention_on(os.environ)

    def apply(self, ranking: Sequence[Any], context: Any) -> tuple[list[Any], dict[str, Any] | None]:
        """Demote each contended local engine; ``None`` section when none is contended or
        no peer could take the request."""
        out = list(ranking)
        load = getattr(self.node, "load", None)
        if load is None or not any(not c.is_local for c in out):
            return out, None
        hold = context.scratch.get(SCRATCH_HOLD)
        held_backend = hold[1] if hold and hold[0] == "local" else None
        groups = context.scratch.get(SCRATCH_GROUPS) or {}
        head_start = int(getattr(context.settings, "poolLocalAffinity", 0) or 0)
        demoted: list[dict[str, Any]] = []
        gave_way: list[tuple[Any, list[Any]]] = []
        for cand in [c for c in out if c.is_local]:
            busy = blocking_work(cand, context, load)
            if not busy:
                continue
            at = _index(out, cand)
            mine, group = _queue(cand, head_start), groups.get(id(cand))
            end = at + 1
            # spec: -np 1 engines; a peer with eight in flight is eight turns, so stop at the first busier
            while end < len(out) and groups.get(id(out[end])) == group and _queue(out[end], head_start) <= mine:
                end += 1
            passes = out[at + 1:end]
            held = False
            if passes and held_backend == cand.backend:
                why = cold_reason(cand, context, load)
                held = why is None
                if not held:
                    log.debug("contention does not hold local %s for prefix affinity: %s", cand.backend, why)
            demoted.append({"node": cand.node, "backend": cand.backend, "busyWith": busy,
                            "runsAt": resolve_window(cand, context, context.model, context.num_ctx),
                            "behind": [] if held else [c.node for c in passes],
                            "overriddenBy": "affinity" if held else None})
            if passes and not held:
                out = out[:at] + passes + [cand] + out[end:]
                gave_way.append((cand, passes))
        if not demoted:
            return out, None
        section = {"numCtx": context.num_ctx, "demoted": demoted,
                   "overridden": any(out[0] is cand for cand, _ in gave_way)}
        context.scratch[SCRATCH_SECTION] = section
        context.scratch[SCRATCH_GAVE_WAY] = gave_way
        return out, section

    def placed(self, context: Any, candidate: Any) -> None:
        """An engine that gave way but is tried first anyway overrides the demotion."""
        self._reached(context, candidate)

    def failed_over(self, context: Any, candidate: Any) -> None:
        """Failover reaching an engine that gave way: the demotion was overridden."""
        self._reached(context, candidate)

    def _reached(self, context: Any, candidate: Any) -> None:
        section = context.scratch.get(SCRATCH_SECTION)
        if section is not None and any(candidate is cand for cand, _ in context.scratch.get(SCRATCH_GAVE_WAY, ())):
            section["overridden"] = True


def _index(items: Sequence[Any], item: Any) -> int:
    return next(i for i, c in enumerate(items) if c is item)


def _queue(candidate: Any, head_start: int) -> float:
    """The ranker's score without the local head start: the footing a contended engine
    is compared on once it gives the head start up."""
    return candidate.score - (0 if candidate.is_local else head_start)
