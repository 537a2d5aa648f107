"""The placement entry: a request description and the node's snapshot in, an ordered plan out
(spec: Ranking, The auto alias; design.md, a request's way through a node).

The route handlers translate HTTP into a :class:`PlacementRequest` and a :class:`Plan` back
into HTTP; everything between — ``auto``, the budget, unservable engines, candidates, the
pin, residency, the stages, withheld engines last, the 502 diagnosis — is one call,
:func:`place`, which tests drive without HTTP. Peer-forwarded work (``/local/*``) is
:func:`place_inbound`: no ranking (the no-relay rule), one local engine or the reason why not.

:func:`snapshot_of` reads what placement needs from a running node, once per request; the
local engines' probe read (with its TTL) is the only I/O there, and residency — read only
when a stage asks, within the placement budget — the only I/O in :func:`place`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from hubpool_core.models_ids import fold_model_id, same_model
from hubpool_core.placement.aliases import alias_target
from hubpool_core.placement.auto import AUTO, AUTO_NOTHING, pool_offers, resolve_auto
from hubpool_core.placement.candidates import Candidate, build_candidates, usable_peers
from hubpool_core.placement.load import Load
from hubpool_core.placement.pins import find_pin, pin_matches, pin_note
from hubpool_core.placement.pipeline import JUDGED_ROUTES, PlacementContext, request_num_ctx, run_stages
from hubpool_core.signals.local_engines import PLACEMENT_BUDGET_MS, LocalBackend, LocalEngines
from hubpool_core.store import PoolPeer

if TYPE_CHECKING:
    import httpx

    from hubpool_core.config import PoolSettings
    from hubpool_core.engine import Engine
    from hubpool_core.stage import Stage

#: names the model the app asked for when an alias or ``auto`` placed another
REQUESTED_HEADER = "X-Hub-Pool-Model-Requested"
#: the 502's last sentence when a local engine did not answer its probe
PROBE_SILENT = (" Some local engines did not answer their probe: localBackends shows what this node "
                "saw of each, and probedMsAgo how old that answer is.")


class ForwardBudgets(Protocol):
    """The one thing placement asks of the proxy's budgets (``hubpool_core.proxy.Budgets``)."""

    def forward_ms(self, estimated_tokens: int, stream: bool) -> int: ...


@dataclass(slots=True)
class PlacementRequest:
    """One request as placement sees it: what the handler read off HTTP, nothing more."""

    route: str  # the app-facing route, e.g. /api/chat (no prefix)
    dialect: str  # hubpool_core.engine.OPENAI or NATIVE
    route_class: str  # chat | completion | embeddings
    #: the model as asked: ``auto``, an engine id, or (inbound) X-Hub-Pool-Model
    model: str
    body: dict[str, Any]
    raw: bytes
    stream: bool
    #: the session the app named (X-Hub-Pool-Session when it passed the character rules, or
    #: another configured source's value, hashed), else None
    session_header: str | None = None
    #: where the session came from (``X-Hub-Pool-Session``, ``metadata.user_id``, ...), else None
    session_source: str | None = None


@dataclass(slots=True)
class NodeSnapshot:
    """What placement reads of the node for one request (:func:`snapshot_of` builds it)."""

    settings: PoolSettings
    #: this node's engines with the probe answer placement uses now (healthy or not)
    backends: list[LocalBackend]
    #: connected, enabled peers when outbound pooling is on; empty for inbound work
    peers: list[PoolPeer]
    load: Load
    #: this node's own GPU-pressure band, None when it cannot measure
    local_pressure: int | None
    stages: Sequence[Stage]
    budgets: ForwardBudgets
    #: (node, engine kind) -> folded model ids withheld there as unservable: not candidates
    unservable: Callable[[str, str], Collection[str]]
    #: (node, engine kind, folded model id) -> withheld after faulty output: ranked last
    withheld: Callable[[tuple[str, str, str]], bool]
    #: the local engines themselves: residency is read from them, the 502 describes them
    local: LocalEngines


@dataclass(slots=True)
class Plan:
    """Where one request goes, in order, and what the routing-log row says about why."""

    #: the model placed: ``auto`` resolved to an engine id
    model: str
    #: the body and bytes to forward (rewritten when ``auto`` was resolved)
    body: dict[str, Any]
    raw: bytes
    #: the pool's prompt estimate: bytes / 4 of ``raw``
    estimated_tokens: int
    budget_ms: int
    #: the walk's order; empty when no node can serve the model
    candidates: list[Candidate]
    #: the routing-log sections the pipeline wrote (``pin`` included): section -> note or None
    sections: dict[str, Any]
    context: PlacementContext
    #: the 502s' sentence about the pin that ordered the candidates, else None
    pin_note: str | None = None
    #: the no-candidate 502's message when ``candidates`` is empty, else None
    diagnosis: str | None = None
    #: the model the app asked for when it is not ``model`` (``auto``, or a name an alias
    #: resolved), else None
    requested: str | None = None


@dataclass(frozen=True, slots=True)
class NoAutoModel:
    """``auto`` was asked and no node in the pool serves a chat model: nothing was ranked
    (the handler answers 502 with ``message`` and opens no routing-log row)."""

    message: str = AUTO_NOTHING


NO_AUTO_MODEL = NoAutoModel()


@dataclass(slots=True)
class InboundPlan:
    """Where peer-forwarded work runs here: the one local engine the sender named, or why not."""

    #: the engine to relay to (at most one: the sender already chose)
    candidates: list[Candidate]
    #: how many local engines of that kind could serve it (the inbound row's ``candidates``)
    able: int
    budget_ms: int
    estimated_tokens: int
    num_ctx: int | None
    #: the 502's message when no local engine can serve it, else None
    diagnosis: str | None = None


async def snapshot_of(node: Any, *, inbound: bool = False, serving: tuple[str, str] | None = None) -> NodeSnapshot:
    """Read the node (``hubpool_core.node.node.Node``, which placement does not import) for
    one placement: the local engines (probed live, or from the snapshot within
    poolProbeSnapshotTtlMs), the usable peers, load, settings and the rest.

    ``inbound``: for work a peer forwarded — no peers (it never relays further), and the
    engines' queue-depth setting is left as the last outbound read set it. ``serving``: the
    (engine kind, model) the sender named, whose last healthy answer serves with a refresh
    behind the request (:meth:`LocalEngines.read_serving`: nothing is ranked here, so
    nothing waits for a probe)."""
    settings = node.settings.current
    if inbound and serving is not None:
        backends = await node.local.read_serving(settings.poolProbeSnapshotTtlMs, *serving)
        peers: list[PoolPeer] = []
    elif inbound:
        backends = await node.local.read(settings.poolProbeSnapshotTtlMs)
        peers = []
    else:
        backends = await node.local.read(settings.poolProbeSnapshotTtlMs,
                                         engine_queue_depth=bool(settings.poolEngineQueueDepth))
        peers = usable_peers(node.peers.all(), node.directions().outbound.enabled)
    return NodeSnapshot(settings, backends, peers, node.load, node.pressure.band, node.stages, node.budgets,
                        node.unservable.withheld_models, node.output_quarantine.withheld, node.local)


async def place(snapshot: NodeSnapshot, request: PlacementRequest) -> Plan | NoAutoModel:
    """Resolve ``auto``, size the budget, rank every candidate and run the stages.

    Returns :data:`NO_AUTO_MODEL` when ``auto`` finds no chat model in the pool; otherwise
    a :class:`Plan`, whose ``diagnosis`` is set exactly when ``candidates`` is empty.
    Resolving ``auto`` rewrites ``request.body["model"]`` in place (the body is the
    request's own; the plan carries it and the re-encoded bytes)."""
    settings = snapshot.settings
    body, raw, model = request.body, request.raw, request.model
    aliased = alias_target(settings.poolModelAliases, model, lambda m: _pool_lists(snapshot, m))
    if aliased is not None:
        model = aliased[0]
        if model != AUTO:
            body["model"] = model
            raw = json.dumps(body).encode()
    if model == AUTO:
        resolved = resolve_auto(snapshot.backends, snapshot.peers, settings.inferenceModel, snapshot.unservable)
        if resolved is None:
            return NO_AUTO_MODEL
        body["model"] = model = resolved
        raw = json.dumps(body).encode()
    requested = request.model if model != request.model else None
    estimated = -(-len(raw) // 4)
    budget = snapshot.budgets.forward_ms(estimated, request.stream)
    folded = fold_model_id(model)
    # a model the local engine failed to serve twice is withheld: not a candidate at all
    unservable = snapshot.unservable
    serving = [b for b in snapshot.backends if folded not in unservable("local", b.engine.kind)]
    ranking = build_candidates(model, serving, snapshot.peers, snapshot.load, local_affinity=settings.poolLocalAffinity,
                               pressure_weight=settings.poolPressureWeight,
                               poll_seconds=settings.poolHealthPollSeconds, local_pressure=snapshot.local_pressure,
                               dialect=request.dialect)
    route = request.route
    ctx = PlacementContext(route=route, route_class=request.route_class, model=model, body=body,
                           estimated_tokens=estimated, settings=settings, num_ctx=request_num_ctx(route, body),
                           session_header=request.session_header, session_source=request.session_source,
                           judged=route in JUDGED_ROUTES)
    ctx.scratch["budget_ms"] = budget
    if requested is not None:
        ctx.response_headers[REQUESTED_HEADER] = requested
    pins = settings.poolPins
    pin = find_pin(pins, model)
    if pin is not None:
        ctx.scratch["pinned_nodes"] = {c.node for c in ranking if pin_matches(pin, c)}
    asked = _residency_asked(snapshot, ranking, ctx)
    if asked:
        ctx.scratch["resident"] = await read_residency(asked, snapshot.local.http)
    withheld = snapshot.withheld
    ordered, sections = run_stages(snapshot.stages, ranking, ctx, pins,
                                   withheld=lambda c: withheld((c.node, c.backend, folded)))
    note = pin_note(pin) if pin is not None and sections.get("pin") else None
    diagnosis = None if ordered else no_candidate_message(model, note, snapshot.backends)
    return Plan(model, body, raw, estimated, budget, ordered, sections, ctx, note, diagnosis, requested)


def _pool_lists(snapshot: NodeSnapshot, model: str) -> bool:
    """Whether a node of the pool lists ``model`` (this node's engines, healthy or not, and
    every usable peer's inventory): an alias never takes a model a node serves."""
    return any(b.lists(model) for b in snapshot.backends) or any(
        same_model(m, model) for m in pool_offers([], snapshot.peers))


def place_inbound(snapshot: NodeSnapshot, request: PlacementRequest, backend_kind: str) -> InboundPlan:
    """Work a peer forwarded: the first healthy local engine of ``backend_kind`` (the
    sender's X-Hub-Pool-Backend) that lists the body's model, never re-ranked."""
    model = request.body.get("model") or request.model
    able = [b for b in snapshot.backends if b.engine.kind == backend_kind and b.healthy and b.lists(model)]
    estimated = -(-len(request.raw) // 4)
    budget = snapshot.budgets.forward_ms(estimated, request.stream)
    if not able:
        return InboundPlan([], 0, budget, estimated, None, f"No local backend able to serve {request.route}")
    first = able[0]
    return InboundPlan([Candidate("local", first.engine.kind, local=first)], len(able), budget, estimated,
                       request_num_ctx(request.route, request.body))


def no_candidate_message(model: str, note: str | None, backends: Sequence[LocalBackend]) -> str:
    """The no-candidate 502's message (its body adds ``localBackends``)."""
    message = f'No pool node currently has model "{model}" available.'
    if note:
        message += " " + note
    if any(not b.snapshot.result.running for b in backends):
        message += PROBE_SILENT
    return message


def _residency_asked(snapshot: NodeSnapshot, ranking: list[Candidate], ctx: PlacementContext) -> list[Engine]:
    """The local engines some stage wants the residency of (``Stage.wants_residency``), and
    that can say; a stage whose question raises is left out, never fatal to placement."""
    kinds: set[str] = set()
    for stage in snapshot.stages:
        ask = getattr(stage, "wants_residency", None)
        if ask is None:
            continue
        try:
            kinds.update(ask(ranking, ctx) or ())
        except Exception:  # noqa: BLE001 - a stage's question must not break placement
            continue
    if not kinds:
        return []
    return [e for e in snapshot.local.engines if e.kind in kinds and e.has_residency]


async def read_residency(engines: Sequence[Engine], http: httpx.AsyncClient) -> dict[str, list[str] | None]:
    """What each engine holds in memory (model ids), read within the 500 ms placement
    budget; a read that fails, is late or cannot say is None ("not shown warm")."""
    tasks = {asyncio.ensure_future(e.residency(http)): e.kind for e in engines}
    done, pending = await asyncio.wait(list(tasks), timeout=PLACEMENT_BUDGET_MS / 1000)
    for task in pending:
        task.cancel()
    resident: dict[str, list[str] | None] = {kind: None for kind in tasks.values()}
    for task in done:
        if not task.cancelled() and task.exception() is None:
            held = task.result()
            if held is not None:
                resident[tasks[task]] = [r.id for r in held]
    return resident
