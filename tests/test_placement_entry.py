"""The placement entry (hubpool_core/placement/plan.py) driven directly, without HTTP:
hypothesis over random local engines, peers, pins, withheld and unservable sets; a few
examples (residency, stages, inbound); and running nodes showing the route handlers and
the direct call agree on candidates, the routing-log row and the 502."""

from __future__ import annotations

import asyncio
import json
from contextlib import ExitStack
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
import pytest
from harness import RunningNode, fqdn, make_pool, pair
from hypothesis import given, settings
from hypothesis import strategies as st

from hubpool_core import Engine, ModelInfo, ProbeResult, Stage
from hubpool_core.api.inference import ROUTED
from hubpool_core.config import Pin, PoolSettings
from hubpool_core.engine import AGENT_DIALECTS, NATIVE, RERANK, EngineConfig, ResidentModel
from hubpool_core.placement import (
    NO_AUTO_MODEL,
    Load,
    NodeSnapshot,
    PlacementRequest,
    Plan,
    build_candidates,
    fold_model_id,
    pin_note,
    place,
    place_inbound,
    same_model,
    snapshot_of,
)
from hubpool_core.placement.plan import PROBE_SILENT
from hubpool_core.signals.local_engines import LocalBackend, LocalEngines, Snapshot
from hubpool_core.store import PoolPeer
from hubpool_sim import SimConfig, SimModel, run_in_thread

P = "/api/inference/pool"
CHAT_MODELS = ["llama3.2:3b", "qwen3:8b", "Qwen3:14B", "tiny:1b", "mistral:7b-instruct"]
NOT_FOR_AUTO = ["nomic-embed-text", "bge-m3", "mxbai-rerank-large", "all-minilm"]
CLOUD = ["kimi-k2:cloud", "glm-4.6:cloud"]
MODELS = CHAT_MODELS + NOT_FOR_AUTO + CLOUD
KINDS = ["alpha", "beta", "gamma"]


class _TestEngine(Engine):
    env_var = "PLACEMENT_ENTRY_TEST_URL"
    default_url = "http://127.0.0.1:9"

    async def probe(self, http: httpx.AsyncClient) -> ProbeResult:
        return ProbeResult(running=True, healthy=True)


class AlphaEngine(_TestEngine):
    kind = "alpha"


class BetaEngine(_TestEngine):
    kind = "beta"


class GammaEngine(_TestEngine):
    kind = "gamma"


ENGINE_CLASSES = {"alpha": AlphaEngine, "beta": BetaEngine, "gamma": GammaEngine}


class Budgets:
    """The proxy's budgets stand-in: deterministic, and it says what it was asked."""

    def forward_ms(self, estimated_tokens: int, stream: bool) -> int:
        return 10_000 + estimated_tokens + (1 if stream else 0)


def drive(coro: Any) -> Any:
    """Run a placement that asks no engine anything: it must finish without suspending
    (no await beyond the residency read a stage asks for)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise AssertionError("placement suspended although no stage asked for residency")


# -- building snapshots ---------------------------------------------------------------

def local_backend(kind: str, models: list[str], running: bool = True, healthy: bool = True) -> LocalBackend:
    engine = ENGINE_CLASSES[kind](EngineConfig(base_url=f"http://127.0.0.1:9/{kind}"))
    result = ProbeResult(running=running, healthy=healthy and running, models=tuple(ModelInfo(m) for m in models),
                         error=None if running else "refused")
    return LocalBackend(engine, Snapshot(result, 0.0))


def pool_peer(i: int, backends: list[tuple[str, bool, list[str]]], accepting: bool | None, fresh: bool,
              reported: int | None, band: int | None, tier: str | None) -> PoolPeer:
    caps: dict[str, Any] = {"backends": [{"type": t, "healthy": h, "modelsLoaded": ms} for t, h, ms in backends],
                            "inFlightRequests": reported, "hardwareTier": tier}
    if accepting is not None:
        caps["acceptingWork"] = accepting
    if band is not None:
        caps["gpuPressure"] = band
    seen = datetime.now(timezone.utc) - (timedelta(0) if fresh else timedelta(hours=1))
    return PoolPeer(id=f"p{i}", node_fqdn=f"n{i}.example.ts.net", direction="outbound", status="connected",
                    enabled=True, last_capabilities=caps, last_seen_at=seen)


def snapshot(backends: list[LocalBackend], peers: list[PoolPeer], *, cfg: PoolSettings | None = None,
             load: Load | None = None, stages: list[Any] | None = None, withheld: set[tuple[str, str]] = frozenset(),
             unservable: dict[str, set[str]] | None = None, local_pressure: int | None = None,
             local: LocalEngines | None = None) -> NodeSnapshot:
    unservable = unservable or {}
    return NodeSnapshot(
        settings=cfg or PoolSettings(), backends=backends, peers=peers, load=load or Load(),
        local_pressure=local_pressure, stages=stages or [], budgets=Budgets(),
        unservable=lambda node, kind: unservable.get(kind, set()) if node == "local" else set(),
        withheld=lambda key: key[:2] in withheld,
        local=local or LocalEngines([b.engine for b in backends]))


def request(model: str, route: str = "/api/chat", *, stream: bool = False, session: str | None = None,
            extra: dict[str, Any] | None = None) -> PlacementRequest:
    dialect, route_class = ROUTED[route]
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hello"}], "stream": stream,
                            **(extra or {})}
    return PlacementRequest(route, dialect, route_class, model, body, json.dumps(body).encode(), stream, session)


def key(c: Any) -> tuple[str, str]:
    return (c.node, c.backend)


# -- strategies ---------------------------------------------------------------------

mostly = st.sampled_from([True, True, True, False])
models_st = st.lists(st.sampled_from(MODELS), min_size=1, max_size=5, unique=True)
local_st = st.lists(st.tuples(st.sampled_from(KINDS), models_st, mostly, mostly),
                    max_size=3, unique_by=lambda t: t[0])
peer_st = st.tuples(
    st.lists(st.tuples(st.sampled_from(KINDS), mostly, models_st), min_size=1, max_size=2),
    st.sampled_from([True, True, False, None]),  # acceptingWork
    st.booleans(),  # fresh
    st.one_of(st.none(), st.integers(0, 6)),  # inFlightRequests
    st.one_of(st.none(), st.integers(0, 3)),  # gpuPressure
    st.sampled_from(["high", "medium", "low", "cpu-only", None, "weird"]),
)


@st.composite
def worlds(draw: Any) -> dict[str, Any]:
    backends = [local_backend(kind, models, running, healthy)
                for kind, models, running, healthy in draw(local_st)]
    peers = [pool_peer(i, *spec) for i, spec in enumerate(draw(st.lists(peer_st, max_size=6)))]
    load = Load()
    load.local = draw(st.integers(0, 4))
    for p in peers:
        load.forwarded[p.id] = draw(st.integers(0, 3))
    nodes = [("local", b.engine.kind) for b in backends] + [
        (p.node_fqdn, b["type"]) for p in peers for b in p.last_capabilities["backends"]]
    withheld = set(draw(st.lists(st.sampled_from(nodes), unique=True))) if nodes else set()
    unservable = {b.engine.kind: {fold_model_id(m) for m in draw(st.lists(st.sampled_from(MODELS), max_size=2))}
                  for b in backends if draw(st.booleans())}
    return {"backends": backends, "peers": peers, "load": load, "withheld": withheld, "unservable": unservable,
            "local_pressure": draw(st.one_of(st.none(), st.integers(0, 3))),
            "affinity": draw(st.integers(0, 3)), "weight": draw(st.integers(0, 3))}


@st.composite
def pins(draw: Any, peers: list[PoolPeer]) -> list[Pin]:
    out = []
    for scope in ("model", "default"):
        if draw(st.booleans()):
            local = draw(st.booleans())
            target = None if local else draw(st.sampled_from([p.id for p in peers] + ["p-gone"]))
            out.append(Pin(scope=scope, model=draw(st.sampled_from(MODELS)) if scope == "model" else None,
                           targetKind="local" if local else "peer", targetPeerId=target))
    return out


def model_in(world: dict[str, Any]) -> st.SearchStrategy[str]:
    """Mostly a model some node lists (healthy or not), sometimes any model at all."""
    listed = sorted({m.id for b in world["backends"] for m in b.snapshot.result.models}
                    | {m for p in world["peers"] for b in p.last_capabilities["backends"] for m in b["modelsLoaded"]})
    return st.sampled_from(listed) | st.sampled_from(MODELS) if listed else st.sampled_from(MODELS)


def offers_model(world: dict[str, Any], model: str, dialect: str | None = None) -> set[tuple[str, str]]:
    """Who may serve ``model`` in ``dialect``, worked out from the world, not from placement's
    code. Rerank has no translation: a local engine must state it, and a peer's backend that
    states its dialects without it is no offer. For an agent dialect a peer's backend that
    states it natively is the one chosen."""
    folded = fold_model_id(model)
    out = {("local", b.engine.kind) for b in world["backends"]
           if b.snapshot.result.running and b.snapshot.result.healthy
           and any(same_model(m.id, model) for m in b.snapshot.result.models)
           and folded not in world["unservable"].get(b.engine.kind, set())
           and (dialect != RERANK or RERANK in b.dialects)}
    for p in world["peers"]:
        caps = p.last_capabilities
        if caps.get("acceptingWork") is False:
            continue
        listing = [b for b in caps["backends"]
                   if b["healthy"] and any(same_model(m, model) for m in b["modelsLoaded"])]
        if dialect == RERANK:
            listing = [b for b in listing if not isinstance(b.get("dialects"), list) or RERANK in b["dialects"]]
        elif dialect in AGENT_DIALECTS:
            listing = ([b for b in listing if dialect in (b.get("dialects") or [])]
                       + [b for b in listing if dialect not in (b.get("dialects") or [])])
        if listing:
            out.add((p.node_fqdn, listing[0]["type"]))
    return out


def pool_models(world: dict[str, Any]) -> set[str]:
    """Every model some node could take (what ``auto`` chooses among): this node's models
    minus the ones it withholds as unservable, plus what each accepting peer advertises."""
    out = {m.id for b in world["backends"] if b.healthy for m in b.snapshot.result.models
           if fold_model_id(m.id) not in world["unservable"].get(b.engine.kind, set())}
    for p in world["peers"]:
        if p.last_capabilities.get("acceptingWork") is not False:
            out |= {m for b in p.last_capabilities["backends"] if b["healthy"] for m in b["modelsLoaded"]}
    return out


def world_snapshot(world: dict[str, Any], cfg: PoolSettings, stages: list[Any] | None = None) -> NodeSnapshot:
    return snapshot(world["backends"], world["peers"], cfg=cfg, load=world["load"], stages=stages,
                    withheld=world["withheld"], unservable=world["unservable"],
                    local_pressure=world["local_pressure"])


# -- properties ---------------------------------------------------------------------

@settings(max_examples=150, deadline=None)
@given(worlds(), st.data(), st.booleans(), st.sampled_from(sorted(ROUTED)),
       st.one_of(st.none(), st.sampled_from(CHAT_MODELS + CLOUD + ["absent:3b"])))
def test_every_plan_holds_the_entrys_promises(world, data, auto, route, preferred):
    model = "auto" if auto else data.draw(model_in(world))
    cfg = PoolSettings(poolLocalAffinity=world["affinity"], poolPressureWeight=world["weight"],
                       poolPins=data.draw(pins(world["peers"])), inferenceModel=preferred)
    asked = request(model, route)
    plan = drive(place(world_snapshot(world, cfg), asked))

    if model == "auto":
        served = pool_models(world)
        chat = {m for m in served if m not in NOT_FOR_AUTO and not m.endswith(":cloud")}
        preferred_served = preferred is not None and any(same_model(m, preferred) for m in served)
        if not chat and not preferred_served:
            assert plan is NO_AUTO_MODEL  # nothing can stand in: nothing was ranked
            return
        assert isinstance(plan, Plan)
        assert plan.model in served
        if not (preferred_served and same_model(plan.model, preferred)):
            # only a Settings → Inference choice can name an embedding model or a :cloud tag
            assert plan.model not in NOT_FOR_AUTO and not fold_model_id(plan.model).endswith(":cloud")
        assert asked.body["model"] == plan.model and plan.body is asked.body
        assert plan.raw == json.dumps(plan.body).encode()
    else:
        assert isinstance(plan, Plan)
        assert plan.model == model and plan.raw is asked.raw

    # the budget is sized on the bytes as forwarded
    assert plan.estimated_tokens == -(-len(plan.raw) // 4)
    assert plan.budget_ms == Budgets().forward_ms(plan.estimated_tokens, asked.stream)
    assert plan.context.model == plan.model and plan.context.scratch["budget_ms"] == plan.budget_ms
    # every candidate offers the model, and everyone who offers it is a candidate, once
    keys = [key(c) for c in plan.candidates]
    assert len(keys) == len(set(keys))
    assert set(keys) == offers_model(world, plan.model, asked.dialect)
    # withheld engines come last
    flags = [k in world["withheld"] for k in keys]
    assert flags == sorted(flags)
    # the 502's diagnosis exactly when nobody can serve it
    assert (plan.diagnosis is not None) == (not plan.candidates)
    if plan.diagnosis is not None:
        assert plan.diagnosis.startswith(f'No pool node currently has model "{plan.model}" available.')
        assert (plan.pin_note is not None and plan.pin_note in plan.diagnosis) == (plan.pin_note is not None)
        silent = any(not b.snapshot.result.running for b in world["backends"])
        assert plan.diagnosis.endswith(PROBE_SILENT) == silent
    # the pin section and note: written exactly when a pin applies to this model
    applies = next((p for p in cfg.poolPins if p.scope == "model" and p.model == plan.model),
                   next((p for p in cfg.poolPins if p.scope == "default"), None))
    assert "pin" in plan.sections
    assert (plan.sections["pin"] is not None) == (applies is not None)
    assert plan.pin_note == (pin_note(applies) if applies is not None else None)


@settings(max_examples=150, deadline=None)
@given(worlds(), st.data())
def test_a_pin_moves_its_target_to_the_front_without_adding_or_removing_anyone(world, data):
    model = data.draw(model_in(world))
    base_cfg = PoolSettings(poolLocalAffinity=world["affinity"], poolPressureWeight=world["weight"])
    base = drive(place(world_snapshot(world, base_cfg), request(model)))
    local = data.draw(st.booleans())
    target = None if local else data.draw(st.sampled_from([p.id for p in world["peers"]] + ["p-gone"]))
    pin = Pin(scope=data.draw(st.sampled_from(["default", "model"])), model=model, targetKind="local" if local
              else "peer", targetPeerId=target)
    if pin.scope == "default":
        pin = Pin(scope="default", targetKind=pin.targetKind, targetPeerId=target)
    pinned = drive(place(world_snapshot(world, base_cfg.model_copy(update={"poolPins": [pin]})), request(model)))

    def hit(c: Any) -> bool:
        return c.is_local if local else c.peer_id == target

    assert sorted(map(key, pinned.candidates)) == sorted(map(key, base.candidates))
    # within the withheld-last order, the pinned node's candidates lead and everyone else
    # keeps the base ranker's order behind them
    expected = sorted(base.candidates, key=lambda c: (key(c) in world["withheld"], not hit(c)))
    assert list(map(key, pinned.candidates)) == list(map(key, expected))
    assert pinned.sections["pin"] == {"scope": pin.scope, "mode": "prefer", "targetKind": pin.targetKind}


class Reverser(Stage):
    """A stage that turns the order around: proves a stage that is off is never called."""

    name = "reverser"
    section = "reversed"

    def __init__(self, order: int, on: bool) -> None:
        super().__init__(None)
        self.order, self.on = order, on
        self.calls = 0

    def enabled(self, context: Any) -> bool:
        return self.on

    def apply(self, ranking: Any, context: Any) -> tuple[list[Any], dict[str, Any] | None]:
        self.calls += 1
        return list(reversed(ranking)), {"reversed": len(ranking)}


def builtin_stages() -> list[Any]:
    """The first-party stages, on a node double whose settings leave each knob at its default."""
    from types import SimpleNamespace

    from hubpool_stages import (
        ContextCapStage,
        LocalContentionStage,
        PrefixAffinityStage,
        PromptCeilingStage,
        SlotsStage,
        SlowerPlacementStage,
        ThroughputStage,
    )

    from hubpool_core.placement.throughput import ThroughputStore

    node = SimpleNamespace(load=Load(), settings=SimpleNamespace(current=PoolSettings()), engine_by_kind={},
                           throughput=ThroughputStore())
    classes = [PrefixAffinityStage, ContextCapStage, PromptCeilingStage, SlotsStage, ThroughputStage,
               LocalContentionStage, SlowerPlacementStage]
    return sorted((cls(node) for cls in classes), key=lambda s: s.order)


BUILTIN = builtin_stages()


@settings(max_examples=150, deadline=None)
@given(worlds(), st.data(), st.sampled_from(["/v1/embeddings", "/api/embed", "/api/embeddings"]),
       st.lists(st.sampled_from([100, 650, 750, 900]), max_size=3))
def test_with_every_stage_off_the_order_is_the_base_rankers(world, data, route, orders):
    model = data.draw(model_in(world))
    # the built-in stages judge only chat and completion, and slots are off by default: on an
    # embeddings route every one of them is off; the doubles are switched off outright
    doubles = [Reverser(order, on=False) for order in orders]
    stages = sorted(BUILTIN + doubles, key=lambda s: s.order)
    cfg = PoolSettings(poolLocalAffinity=world["affinity"], poolPressureWeight=world["weight"])
    world = {**world, "withheld": set()}
    plan = drive(place(world_snapshot(world, cfg, stages), request(model, route)))
    folded = fold_model_id(model)
    serving = [b for b in world["backends"] if folded not in world["unservable"].get(b.engine.kind, set())]
    base = build_candidates(model, serving, world["peers"], world["load"], local_affinity=world["affinity"],
                            pressure_weight=world["weight"], poll_seconds=cfg.poolHealthPollSeconds,
                            local_pressure=world["local_pressure"])
    assert list(map(key, plan.candidates)) == list(map(key, base))
    assert plan.sections == {"pin": None}
    assert all(d.calls == 0 for d in doubles)


@settings(max_examples=100, deadline=None)
@given(worlds(), st.data(), st.sampled_from([100, 650, 750, 900]))
def test_a_stage_reorders_but_never_adds_or_removes_and_withheld_stay_last(world, data, order):
    model = data.draw(model_in(world))
    stage = Reverser(order, on=True)
    plan = drive(place(world_snapshot(world, PoolSettings(), [stage]), request(model)))
    keys = [key(c) for c in plan.candidates]
    assert set(keys) == offers_model(world, model)
    flags = [k in world["withheld"] for k in keys]
    assert flags == sorted(flags)
    assert stage.calls == 1 and plan.sections["reversed"] == {"reversed": len(keys)}


# -- examples -------------------------------------------------------------------------

def test_a_local_engine_holding_the_model_leads_an_idle_pool():
    backends = [local_backend("alpha", ["llama3.2:3b"])]
    peers = [pool_peer(0, [("beta", True, ["llama3.2:3b"])], True, True, 0, None, "high")]
    plan = drive(place(snapshot(backends, peers), request("llama3.2:3b", session="sess-1")))
    assert [key(c) for c in plan.candidates] == [("local", "alpha"), ("n0.example.ts.net", "beta")]
    assert plan.diagnosis is None and plan.pin_note is None
    assert plan.context.session_header == "sess-1" and plan.context.judged
    assert plan.context.route_class == "chat" and plan.context.num_ctx is None


def test_num_ctx_is_read_on_the_native_routes_only():
    backends = [local_backend("alpha", ["m:8b"])]
    native = drive(place(snapshot(backends, []), request("m:8b", "/api/chat", extra={"options": {"num_ctx": 8192}})))
    openai = drive(place(snapshot(backends, []), request("m:8b", "/v1/chat/completions",
                                                          extra={"options": {"num_ctx": 8192}})))
    assert (native.context.num_ctx, openai.context.num_ctx) == (8192, None)


def test_the_no_candidate_diagnosis_names_the_pin_and_the_silent_engines():
    backends = [local_backend("alpha", ["other:1b"]), local_backend("beta", [], running=False)]
    cfg = PoolSettings(poolPins=[Pin(scope="default", targetKind="peer", targetPeerId="p7")])
    plan = drive(place(snapshot(backends, [], cfg=cfg), request("wanted:8b")))
    assert plan.candidates == []
    assert plan.diagnosis == (
        'No pool node currently has model "wanted:8b" available. A routing pin (default scope, prefer peer p7) '
        "ordered the candidates; a pin only reorders, and is not what caused this. Some local engines did not "
        "answer their probe: localBackends shows what this node saw of each, and probedMsAgo how old that "
        "answer is.")


def test_an_unservable_model_is_no_candidate_but_a_withheld_one_is_ranked_last():
    # ids fold ``:latest`` away, here as everywhere in placement
    backends = [local_backend("alpha", ["m"]), local_backend("beta", ["m:latest"])]
    peers = [pool_peer(0, [("gamma", True, ["m"])], True, True, 5, None, "low")]
    plan = drive(place(snapshot(backends, peers, unservable={"alpha": {fold_model_id("m")}},
                                withheld={("local", "beta")}), request("m:latest")))
    assert [key(c) for c in plan.candidates] == [("n0.example.ts.net", "gamma"), ("local", "beta")]


def test_auto_with_nothing_to_stand_in_is_its_own_outcome():
    backends = [local_backend("alpha", ["nomic-embed-text", "kimi-k2:cloud"])]
    assert drive(place(snapshot(backends, []), request("auto"))) is NO_AUTO_MODEL
    # the operator's choice may name a :cloud tag; the ranking alone never does
    cfg = PoolSettings(inferenceModel="kimi-k2:cloud")
    plan = drive(place(snapshot(backends, [], cfg=cfg), request("auto")))
    assert plan.model == "kimi-k2:cloud" and [key(c) for c in plan.candidates] == [("local", "alpha")]


def test_auto_is_resolved_across_the_pool_before_ranking():
    backends = [local_backend("alpha", ["tiny:1b", "bge-m3"])]
    peers = [pool_peer(0, [("beta", True, ["qwen3:8b"])], True, True, 0, None, "high")]
    asked = request("auto", stream=True)
    plan = drive(place(snapshot(backends, peers), asked))
    assert plan.model == "qwen3:8b" and [key(c) for c in plan.candidates] == [("n0.example.ts.net", "beta")]
    assert json.loads(plan.raw)["model"] == "qwen3:8b" and plan.budget_ms == 10_001 + -(-len(plan.raw) // 4)


class _Resident(_TestEngine):
    kind = "resident"
    has_residency = True
    delay = 0.0
    held: list[ResidentModel] | None = None

    async def residency(self, http: httpx.AsyncClient) -> list[ResidentModel] | None:
        await asyncio.sleep(self.delay)
        return self.held


class _SlowResident(_Resident):
    kind = "slowresident"
    delay = 5.0


class _Asker(Stage):
    name = "asker"
    section = "asker"
    order = 100

    def __init__(self, kinds: list[str], raises: bool = False) -> None:
        super().__init__(None)
        self.kinds, self.raises = kinds, raises
        self.seen: Any = "not called"

    def wants_residency(self, ranking: Any, context: Any) -> list[str]:
        if self.raises:
            raise RuntimeError("a broken question")
        return self.kinds

    def apply(self, ranking: Any, context: Any) -> tuple[list[Any], dict[str, Any] | None]:
        self.seen = context.scratch.get("resident", "unread")
        return list(ranking), None


def test_residency_is_read_only_when_a_stage_asks_and_within_the_placement_budget():
    async def go() -> None:
        quick = _Resident(EngineConfig("http://127.0.0.1:9"))
        quick.held = [ResidentModel("m:8b")]
        slow = _SlowResident(EngineConfig("http://127.0.0.1:9"))
        local = LocalEngines([quick, slow])
        try:
            backends = [LocalBackend(quick, Snapshot(ProbeResult(True, True, (ModelInfo("m:8b"),)), 0.0))]
            asker, broken = _Asker(["resident", "slowresident", "nobody"]), _Asker(["resident"], raises=True)
            started = asyncio.get_running_loop().time()
            plan = await place(snapshot(backends, [], stages=[broken, asker], local=local), request("m:8b"))
            took = asyncio.get_running_loop().time() - started
            assert asker.seen == {"resident": ["m:8b"], "slowresident": None}  # late is "not shown warm"
            assert plan.context.scratch["resident"] == asker.seen
            assert 0.4 < took < 2.0  # waited the 500 ms budget for the slow one, not its 5 s
            # nobody asking: nothing read, nothing awaited
            quiet = _Asker([])
            plan = drive(place(snapshot(backends, [], stages=[quiet], local=local), request("m:8b")))
            assert quiet.seen == "unread" and "resident" not in plan.context.scratch
        finally:
            await local.close()

    asyncio.run(go())


def test_inbound_placement_takes_the_named_engine_or_says_why_not():
    backends = [local_backend("alpha", ["m:8b"], healthy=False), local_backend("beta", ["m:8b"])]
    snap = snapshot(backends, [])
    asked = request("m:8b", "/api/chat", extra={"options": {"num_ctx": 4096}})
    plan = place_inbound(snap, asked, "beta")
    assert [key(c) for c in plan.candidates] == [("local", "beta")] and plan.able == 1
    assert plan.diagnosis is None and plan.num_ctx == 4096
    assert plan.estimated_tokens == -(-len(asked.raw) // 4) and plan.budget_ms == 10_000 + plan.estimated_tokens
    refused = place_inbound(snap, asked, "alpha")  # unhealthy: never another engine instead
    assert refused.candidates == [] and refused.able == 0
    assert refused.diagnosis == "No local backend able to serve /api/chat"


# -- through running nodes: the handlers and the direct call agree ----------------------

def _op(node: RunningNode, method: str, path: str, body: Any = None) -> Any:
    with node.client(headers=node.headers()) as c:
        r = c.request(method, P + path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _row(node: RunningNode, rid: str) -> dict[str, Any]:
    return next(e for e in _op(node, "GET", "/routing-log?limit=500")["entries"] if e["id"] == rid)


def _direct(node: RunningNode, route: str, body: dict[str, Any]) -> tuple[Any, NodeSnapshot, bytes]:
    """What the handler would place for these bytes, asked of the entry on the node's loop."""
    raw = json.dumps(body).encode()
    dialect, route_class = ROUTED[route]
    stream = body.get("stream") is not False if dialect == NATIVE else body.get("stream") is True

    async def go() -> tuple[Any, NodeSnapshot]:
        snap = await snapshot_of(node.node)
        return await place(snap, PlacementRequest(route, dialect, route_class, body["model"], dict(body), raw,
                                                  stream)), snap

    plan, snap = node.run(go())
    return plan, snap, raw


def _agree(node: RunningNode, route: str, model: str) -> tuple[Any, httpx.Response]:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "stream": False}
    plan, snap, raw = _direct(node, route, body)
    r = httpx.post(node.url + route, content=raw, headers={"Content-Type": "application/json"}, timeout=60)
    assert isinstance(plan, Plan)
    row = _row(node, r.headers["x-hub-pool-request-id"])
    assert (row["model"], row["candidates"], row["bodyBytes"], row["budgetMs"]) == (
        plan.model, len(plan.candidates), len(plan.raw), plan.budget_ms)
    for section, value in plan.sections.items():
        assert row[section] == value, section
    if plan.candidates:
        assert r.status_code == 200, r.text
        first = plan.candidates[0]
        assert (r.headers["x-hub-pool-served-by"], r.headers["x-hub-pool-backend"], r.headers["x-hub-pool-model"]) \
            == (first.node, first.backend, plan.model)
    else:
        assert r.status_code == 502 and row["outcome"] == "failed" and row["reason"] == "no candidate"
        answer = r.json()
        assert answer["error"] == plan.diagnosis
        described = node.run(node.node.local.describe_for_502(snap.backends, plan.model))
        strip = [{k: v for k, v in b.items() if k != "probedMsAgo"} for b in answer["localBackends"]]
        assert strip == [{k: v for k, v in b.items() if k != "probedMsAgo"} for b in described]
    return plan, r


def test_the_handler_and_the_direct_call_agree_on_one_node(node):
    # the conftest node: a simulated Ollama (llama3.2:3b, an embedder) and vLLM (qwen3:8b,
    # bge-small); the other engine variables point at a closed port (they "did not answer")
    plan, _ = _agree(node, "/api/chat", "llama3.2:3b")
    assert [key(c) for c in plan.candidates] == [("local", "ollama")]
    plan, _ = _agree(node, "/v1/chat/completions", "qwen3:8b")
    assert [key(c) for c in plan.candidates] == [("local", "vllm")]
    plan, r = _agree(node, "/api/chat", "auto")
    assert plan.model == "qwen3:8b" and r.headers["x-hub-pool-model"] == "qwen3:8b"
    plan, _ = _agree(node, "/api/chat", "absent:1b")
    assert plan.diagnosis.endswith(PROBE_SILENT)
    _op(node, "POST", "/pins", {"scope": "default", "targetKind": "local"})
    plan, r = _agree(node, "/api/chat", "absent:1b")
    assert plan.pin_note and plan.pin_note in r.json()["error"]
    assert r.json()["error"] == plan.diagnosis


@pytest.fixture
def two_nodes(tmp_path):
    """hub-a (a simulated Ollama with llama3.2:3b) paired with hub-b (a simulated vLLM with qwen3:8b)."""
    with ExitStack() as stack:
        sims = {"hub-a": stack.enter_context(run_in_thread(SimConfig(flavor="ollama", models=[
                    SimModel("llama3.2:3b")], decode_ms_per_token=0))),
                "hub-b": stack.enter_context(run_in_thread(SimConfig(flavor="vllm", models=[
                    SimModel("qwen3:8b")], decode_ms_per_token=0)))}
        nodes = make_pool(tmp_path, list(sims), per_node={"hub-a": {"OLLAMA_URL": sims["hub-a"].url},
                                                         "hub-b": {"VLLM_URL": sims["hub-b"].url}})
        for n in nodes.values():
            stack.callback(n.stop)
            n.start()
        pair(nodes["hub-a"], nodes["hub-b"])
        for _ in range(2):  # a second round: the pairing now signs both ways
            for n in nodes.values():
                n.run(n.node.health.poll_once())
        yield nodes


def test_outbound_and_inbound_handlers_agree_with_the_entry_across_two_nodes(two_nodes):
    a, b = two_nodes["hub-a"], two_nodes["hub-b"]
    plan, r = _agree(a, "/api/chat", "qwen3:8b")  # only the peer holds it
    assert [key(c) for c in plan.candidates] == [(fqdn("hub-b"), "vllm")]
    # the same request id joins hub-b's inbound row; its placement is place_inbound's
    inbound = _row(b, r.headers["x-hub-pool-request-id"])
    raw = json.dumps({"model": "qwen3:8b", "messages": [{"role": "user", "content": "hello"}],
                      "stream": False}).encode()
    dialect, route_class = ROUTED["/api/chat"]
    asked = PlacementRequest("/api/chat", dialect, route_class, "qwen3:8b", json.loads(raw), raw, False)

    async def go() -> Any:
        return place_inbound(await snapshot_of(b.node, inbound=True), asked, "vllm")

    local = b.run(go())
    assert (inbound["direction"], inbound["candidates"], inbound["budgetMs"], inbound["outcome"]) == (
        "inbound", local.able, local.budget_ms, "served")
    assert [key(c) for c in local.candidates] == [("local", "vllm")]
    # hub-a's own model stays home; a model neither holds is the entry's diagnosis
    plan, _ = _agree(a, "/api/chat", "llama3.2:3b")
    assert [key(c) for c in plan.candidates] == [("local", "ollama")]
    _agree(a, "/api/chat", "absent:1b")


def test_auto_sizes_a_mixture_of_experts_by_its_total(tmp_path):
    """Issue 26.14: qwen3:30b-a3b was read as 3 B (the a3b active count), below the 7 B line,
    so auto chose llama3.1:8b over it; qwen3:235b-a22b read as 22 B. Sizes are totals."""
    cfg = SimConfig(flavor="ollama", models=[SimModel("llama3.1:8b"), SimModel("qwen3:30b-a3b")],
                    decode_ms_per_token=0)
    with run_in_thread(cfg) as sim, RunningNode(tmp_path / "n", {"OLLAMA_URL": sim.url}) as node:
        r = httpx.post(node.url + "/v1/chat/completions", timeout=30,
                       json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and r.headers["x-hub-pool-model"] == "qwen3:30b-a3b", r.text
        shown = httpx.post(node.url + "/api/show", json={"model": "auto"}, timeout=30)
        assert shown.status_code == 200 and shown.headers["x-hub-pool-model"] == "qwen3:30b-a3b"


def test_a_local_pins_target_is_unavailable_while_its_model_is_withheld_here(tmp_path):
    """Issue 26.18: targetAvailable for a local pin ignored a model this node withheld as
    unservable, which routing leaves out of the candidates (spec: "computed from the same
    predicates routing uses")."""
    cfg = SimConfig(flavor="ollama", models=[SimModel("m:8b"), SimModel("other:8b")], decode_ms_per_token=0)
    with run_in_thread(cfg) as sim, RunningNode(tmp_path / "n", {"OLLAMA_URL": sim.url}) as node:
        for model in ("m:8b", "other:8b"):
            _op(node, "POST", "/pins", {"scope": "model", "model": model, "targetKind": "local"})

        def available():
            return {p["model"]: p["targetAvailable"] for p in _op(node, "GET", "/status")["pins"]}

        assert available() == {"m:8b": True, "other:8b": True}
        sim.add_fault("error:503", model="m:8b", count=2)
        for _ in range(2):  # two 5xx within five minutes: withheld here
            r = httpx.post(node.url + "/api/chat", timeout=30, json={
                "model": "m:8b", "stream": False, "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 502, r.text
        r = httpx.post(node.url + "/api/chat", timeout=30, json={
            "model": "m:8b", "stream": False, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 502 and "no candidate" in _row(node, r.headers["x-hub-pool-request-id"])["reason"]
        assert available() == {"m:8b": False, "other:8b": True}  # as routing sees it
