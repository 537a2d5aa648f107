"""The stage pipeline: what stages read about a request, and the order they run in (spec:
Ranking; design.md, a request's way through a node).

Stages run in their declared order with the operator pin at ``PIN_ORDER``; withheld
engines go last after every stage. A pure function of the ranking and the context.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hubpool_core.placement.candidates import Candidate
from hubpool_core.placement.pins import apply_pin

_log = logging.getLogger("hubpool.placement")

#: the chat and completion routes: the ones ceilings, caps and prompt-aware stages judge
JUDGED_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/api/chat", "/api/generate",
                           "/v1/messages", "/v1/responses"})


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
    #: the session the app named: X-Hub-Pool-Session when it passed the character rules, or
    #: another configured source's value (already hashed)
    session_header: str | None = None
    #: which source named it (``X-Hub-Pool-Session``, ``metadata.user_id``, ``session_id``)
    session_source: str | None = None
    #: the chat and completion routes: the ones ceilings, caps and prompt-aware stages judge
    judged: bool = False
    #: response headers a stage wants on the answer (and on the 502), e.g. X-Hub-Pool-Affinity
    response_headers: dict[str, str] = field(default_factory=dict)
    #: what stages computed for the walk's observers (session keys and the like)
    scratch: dict[str, Any] = field(default_factory=dict)
    #: engines withheld for bad output, which the pipeline puts last after every stage (set by
    #: run_stages; None: nothing is withheld). A stage that judges "the node that goes first"
    #: judges the first one not withheld (spec: Never toward a withheld engine)
    withheld: Callable[[Candidate], bool] | None = None


def request_num_ctx(route: str, body: dict[str, Any]) -> int | None:
    """options.num_ctx, read only on the native routes (the OpenAI dialect carries none)."""
    if not route.startswith("/api/"):
        return None
    options = body.get("options")
    value = options.get("num_ctx") if isinstance(options, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def run_stages(stages: Sequence[Any], ranking: list[Candidate], ctx: PlacementContext, pins: list[Any],
               withheld: Callable[[Candidate], bool] | None = None) -> tuple[list[Candidate], dict[str, Any]]:
    """The pipeline: stages in order, the pin at PIN_ORDER, withheld engines last.

    Returns the final order and every section written (``pin`` included). A stage whose
    ``enabled`` is false is not called; its section stays None. A stage that raises is
    skipped for this request (logged), never fatal to placement.
    """
    from hubpool_core.stage import PIN_ORDER

    sections: dict[str, Any] = {}
    pinned = False
    ctx.withheld = withheld
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
