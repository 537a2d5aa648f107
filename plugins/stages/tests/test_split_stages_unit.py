"""The split stages — context cap, prompt ceiling, slots — one by one, nested, under the pin,
and as properties (hypothesis): nothing removed, nothing moved when every knob is off or
nothing is stated, nothing moved when every candidate is demoted, and a pin never bringing a
node out of a worse group."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hubpool_stages import LocalContentionStage, PrefixAffinityStage
from hubpool_stages.splits import ContextCapStage, PromptCeilingStage, SlotsStage, split
from hypothesis import given, settings
from hypothesis import strategies as st

from hubpool_core.placement import JUDGED_ROUTES, Candidate, PlacementContext, run_stages

ROUTE_CLASS = {"/v1/chat/completions": "chat", "/api/chat": "chat", "/v1/completions": "completion",
               "/api/generate": "completion", "/v1/embeddings": "embeddings", "/api/embed": "embeddings"}
SLOTTED = {"ollama": True, "llamacpp": True, "vllm": False, "lemonade": False}


@pytest.fixture(autouse=True)
def contention_off(monkeypatch):
    monkeypatch.setenv("HUB_POOL_CONTENTION_PLACEMENT", "off")


def cfg(*, cap=None, ceiling=None, slots=None, aware=0, head_start=1):
    return SimpleNamespace(maxNumCtx=cap, poolMaxPromptTokens=ceiling, ollamaSlots=slots, poolSlotAwareness=aware,
                           poolLocalAffinity=head_start, poolPrefixAffinityMaxInFlight=0, poolPrefixAffinityMargin=0)


def hub(env_ceiling=None):
    """A node as the stages see it: its environment, its engines by kind, its load."""
    from hubpool_core.placement import Load

    engines = {kind: SimpleNamespace(kind=kind, states_slots=states) for kind, states in SLOTTED.items()}
    return SimpleNamespace(env=SimpleNamespace(max_prompt_tokens=env_ceiling), engine_by_kind=engines, load=Load())


def local(kind="ollama", in_flight=0):
    engine = SimpleNamespace(kind=kind, states_slots=SLOTTED[kind], renders_own_template=True, has_residency=False)
    backend = SimpleNamespace(engine=engine, snapshot=SimpleNamespace(result=SimpleNamespace(models=[])))
    return Candidate("local", kind, local=backend, score=in_flight, in_flight=in_flight)


def peer(name, backend="ollama", in_flight=0, head_start=1, **caps):
    row = SimpleNamespace(id="id-" + name, node_fqdn=name, last_capabilities=dict(caps))
    return Candidate(name, backend, peer=row, score=in_flight + head_start, tier_rank=2, in_flight=in_flight)


def ctx(route="/api/chat", *, settings_=None, tokens=100, num_ctx=None):
    return PlacementContext(route=route, route_class=ROUTE_CLASS.get(route, "show"), model="m", body={"model": "m"},
                            estimated_tokens=tokens, settings=settings_ or cfg(), num_ctx=num_ctx,
                            judged=route in JUDGED_ROUTES)


def names(ranking):
    return [c.node for c in ranking]


def pin_at(target):
    kind = "local" if target == "local" else "peer"
    return SimpleNamespace(scope="default", model=None, mode="prefer", targetKind=kind,
                           targetPeerId=None if kind == "local" else "id-" + target)


def pipeline(node=None):
    node = node or hub()
    return [PrefixAffinityStage(node), ContextCapStage(node), PromptCeilingStage(node), SlotsStage(node),
            LocalContentionStage(node)]


# -- the context cap -----------------------------------------------------------------------

def test_a_capped_node_below_the_requested_window_moves_behind_every_node_that_can_take_it():
    ranking = [local(), peer("small", maxNumCtx=8192), peer("big", maxNumCtx=65536), peer("open")]
    c = ctx(settings_=cfg(cap=16384), num_ctx=32768)
    out, section = ContextCapStage(hub()).apply(ranking, c)
    assert names(out) == ["big", "open", "local", "small"]
    assert section == {"numCtx": 32768, "source": "request", "overridden": False,
                       "excluded": [{"node": "local", "maxNumCtx": 16384}, {"node": "small", "maxNumCtx": 8192}]}
    assert c.scratch["groups"] == {id(ranking[0]): (1,), id(ranking[1]): (1,), id(ranking[2]): (0,),
                                   id(ranking[3]): (0,)}


def test_without_num_ctx_the_prompt_estimate_is_the_window():
    ranking = [local(), peer("b")]
    out, section = ContextCapStage(hub()).apply(ranking, ctx("/v1/chat/completions", settings_=cfg(cap=4096),
                                                             tokens=5000))
    assert names(out) == ["b", "local"]
    assert section["source"] == "estimated" and section["numCtx"] == 5000
    out, section = ContextCapStage(hub()).apply(ranking, ctx(settings_=cfg(cap=4096), tokens=4096))
    assert names(out) == ["local", "b"] and section["excluded"] == []  # at the cap is not below it


def test_no_cap_anywhere_is_a_null_section_and_every_cap_below_moves_nothing():
    ranking = [local(), peer("b", maxNumCtx=True), peer("c", maxNumCtx="65536"), peer("d", maxNumCtx=0)]
    c = ctx(num_ctx=1 << 20)
    assert ContextCapStage(hub()).apply(ranking, c) == (ranking, None)
    capped = [local(), peer("b", maxNumCtx=8192)]
    c = ctx(settings_=cfg(cap=4096), num_ctx=16384)
    out, section = ContextCapStage(hub()).apply(capped, c)
    assert out == capped and section["excluded"] == [] and "groups" not in c.scratch


def test_caps_judge_only_the_chat_and_completion_routes():
    stage = ContextCapStage(hub())
    assert stage.enabled(ctx("/api/generate")) and stage.enabled(ctx("/v1/completions"))
    assert not stage.enabled(ctx("/v1/embeddings")) and not stage.enabled(ctx("/api/embed"))


# -- the prompt ceiling --------------------------------------------------------------------

def test_a_node_whose_ceiling_is_below_the_estimate_moves_back_and_the_environment_wins():
    ranking = [local(), peer("b", maxPromptTokens=4096), peer("c")]
    out, section = PromptCeilingStage(hub()).apply(ranking, ctx(settings_=cfg(ceiling=2048), tokens=3000))
    assert names(out) == ["b", "c", "local"]
    assert section == {"estimatedTokens": 3000, "excluded": [{"node": "local", "maxPromptTokens": 2048}],
                       "overridden": False}
    out, section = PromptCeilingStage(hub(env_ceiling="8192")).apply(ranking, ctx(settings_=cfg(ceiling=2048),
                                                                                  tokens=3000))
    assert names(out) == ["local", "b", "c"] and section["excluded"] == []
    out, section = PromptCeilingStage(hub(env_ceiling="1024")).apply(ranking, ctx(tokens=5000))
    assert names(out) == ["c", "local", "b"]
    assert section["excluded"] == [{"node": "local", "maxPromptTokens": 1024}, {"node": "b", "maxPromptTokens": 4096}]
    # an environment value out of range is ignored, not guessed at: the setting stands
    assert PromptCeilingStage(hub(env_ceiling="12")).local_ceiling(ctx(settings_=cfg(ceiling=2048))) == 2048


def test_no_ceiling_is_null_and_every_node_over_its_ceiling_moves_nothing():
    ranking = [local(), peer("b")]
    assert PromptCeilingStage(hub()).apply(ranking, ctx(tokens=10**6)) == (ranking, None)
    ranking = [local(), peer("b", maxPromptTokens=1024)]
    out, section = PromptCeilingStage(hub()).apply(ranking, ctx(settings_=cfg(ceiling=1024), tokens=2000))
    assert out == ranking and section == {"estimatedTokens": 2000, "excluded": [], "overridden": False}


def test_the_ceiling_splits_within_the_cap_groups():
    # local can take the window but not the prompt; "small" the prompt but not the window
    ranking = [local(), peer("small", maxNumCtx=4096), peer("ok")]
    c = ctx(settings_=cfg(ceiling=2048), num_ctx=8192, tokens=3000)
    out, _ = ContextCapStage(hub()).apply(ranking, c)
    out, section = PromptCeilingStage(hub()).apply(out, c)
    assert names(out) == ["ok", "local", "small"]  # small never leapfrogs local: it is in a worse cap group
    assert c.scratch["groups"][id(ranking[1])] == (1, 0)
    assert c.scratch["groups"][id(ranking[0])] == (0, 1)
    assert c.scratch["groups"][id(ranking[2])] == (0, 0)
    # a cap group with nobody under the ceiling keeps its order: the ceiling has nothing to say there
    ranking = [local(), peer("small", maxNumCtx=4096)]
    c = ctx(settings_=cfg(ceiling=2048), num_ctx=8192, tokens=3000)
    out, _ = ContextCapStage(hub()).apply(ranking, c)
    out, section = PromptCeilingStage(hub()).apply(out, c)
    assert names(out) == ["local", "small"] and section["excluded"] == []


# -- slots ---------------------------------------------------------------------------------

def test_a_full_engine_moves_behind_every_candidate_with_a_free_slot():
    ranking = [local(in_flight=2), peer("b", in_flight=1, ollamaSlots=4), peer("c", in_flight=3, ollamaSlots=2)]
    c = ctx(settings_=cfg(slots=2, aware=1))
    out, section = SlotsStage(hub()).apply(ranking, c)
    assert names(out) == ["b", "local", "c"]
    assert section == {"overridden": False, "demoted": [
        {"node": "local", "backend": "ollama", "inFlight": 2, "slots": 2},
        {"node": "c", "backend": "ollama", "inFlight": 3, "slots": 2}]}


def test_unstated_is_neither_full_nor_free():
    # vLLM's concurrency is no slot count; "quiet" states none; neither moves, neither is a refuge
    ranking = [local(in_flight=2), peer("v", "vllm", in_flight=0, ollamaSlots=4), peer("quiet", in_flight=0)]
    c = ctx(settings_=cfg(slots=2, aware=1))
    out, section = SlotsStage(hub()).apply(ranking, c)
    assert out == ranking and section == {"demoted": [], "overridden": False}
    assert "groups" not in c.scratch
    # with a free stated candidate the full one moves behind it, and the unstated keep their order
    ranking = ranking + [peer("free", in_flight=0, ollamaSlots=4)]
    out, section = SlotsStage(hub()).apply(ranking, ctx(settings_=cfg(slots=2, aware=1)))
    assert names(out) == ["v", "quiet", "free", "local"]
    # no count stated anywhere: a null section
    assert SlotsStage(hub()).apply(ranking[1:3], ctx(settings_=cfg(aware=1))) == (ranking[1:3], None)


def test_a_peer_engine_is_read_by_the_kind_this_node_knows():
    ranking = [peer("a", "llamacpp", in_flight=2, ollamaSlots=2), peer("b", "mystery", in_flight=0, ollamaSlots=4),
               peer("c", "ollama", in_flight=0, ollamaSlots=4)]
    out, section = SlotsStage(hub()).apply(ranking, ctx(settings_=cfg(aware=1)))
    assert names(out) == ["b", "c", "a"]  # an engine kind this node does not know states nothing
    assert section["demoted"] == [{"node": "a", "backend": "llamacpp", "inFlight": 2, "slots": 2}]


def test_every_candidate_full_moves_nothing():
    ranking = [local(in_flight=3), peer("b", in_flight=4, ollamaSlots=4)]
    out, section = SlotsStage(hub()).apply(ranking, ctx(settings_=cfg(slots=2, aware=1)))
    assert out == ranking and section == {"demoted": [], "overridden": False}


def test_slots_are_off_at_0_and_judged_on_every_route_that_takes_a_slot():
    stage = SlotsStage(hub())
    assert not stage.enabled(ctx(settings_=cfg(slots=2)))
    on = cfg(slots=2, aware=1)
    assert stage.enabled(ctx("/v1/embeddings", settings_=on)) and stage.enabled(ctx("/api/embed", settings_=on))
    assert stage.enabled(ctx("/api/chat", settings_=on))
    assert not stage.enabled(ctx("/api/show", settings_=on))  # the lookup occupies no slot


def test_slots_split_within_the_ceiling_groups():
    # "far" has a free slot but is over its ceiling: the full local engine stays ahead of it
    ranking = [local(in_flight=2), peer("far", in_flight=0, ollamaSlots=4, maxPromptTokens=1024),
               peer("near", in_flight=1, ollamaSlots=2)]
    c = ctx(settings_=cfg(slots=2, aware=1), tokens=2000)
    out, _ = PromptCeilingStage(hub()).apply(ranking, c)
    out, section = SlotsStage(hub()).apply(out, c)
    assert names(out) == ["near", "local", "far"]
    assert [d["node"] for d in section["demoted"]] == ["local"]


# -- the walk's observers -------------------------------------------------------------------

@pytest.mark.parametrize("hook", ["placed", "failed_over"])
def test_placing_on_a_demoted_candidate_overrides_the_demotion(hook):
    ranking = [local(), peer("b")]
    c = ctx(settings_=cfg(cap=4096), num_ctx=8192)
    stage = ContextCapStage(hub())
    out, section = stage.apply(ranking, c)
    stage.placed(c, out[0])
    assert section["overridden"] is False
    getattr(stage, hook)(c, out[1])
    assert section["overridden"] is True


def test_overridden_is_per_stage_and_per_request():
    node = hub()
    stages = pipeline(node)
    ranking = [local(in_flight=2), peer("b", in_flight=0, ollamaSlots=4, maxPromptTokens=1024)]
    c = ctx(settings_=cfg(slots=2, aware=1), tokens=2000)
    out, sections = run_stages(stages, ranking, c, [])
    assert names(out) == ["local", "b"]  # b is over its ceiling; the full local engine has nowhere better
    assert sections["slots"] == {"demoted": [], "overridden": False}
    for stage in stages:
        stage.failed_over(c, out[1])
    assert sections["promptCeiling"]["overridden"] is True and sections["slots"]["overridden"] is False
    other = ctx(settings_=cfg(slots=2, aware=1), tokens=2000)
    _, again = run_stages(stages, [local(in_flight=2), peer("b", ollamaSlots=4, maxPromptTokens=1024)], other, [])
    assert again["promptCeiling"]["overridden"] is False


# -- the pin, through the pipeline ----------------------------------------------------------

def test_a_pin_at_a_capped_node_does_not_bring_a_large_window_back_to_the_front():
    ranking = [local(), peer("capped", maxNumCtx=4096), peer("open")]
    c = ctx(num_ctx=16384)
    out, sections = run_stages(pipeline(), ranking, c, [pin_at("capped")])
    assert names(out) == ["local", "open", "capped"]
    assert sections["pin"] == {"scope": "default", "mode": "prefer", "targetKind": "peer"}
    # within its own group a pin still leads: "open" pinned goes ahead of local
    out, _ = run_stages(pipeline(), ranking, ctx(num_ctx=16384), [pin_at("open")])
    assert names(out) == ["open", "local", "capped"]
    # and a small window is no split at all: the pin is what it always was
    out, _ = run_stages(pipeline(), ranking, ctx(num_ctx=2048), [pin_at("capped")])
    assert names(out) == ["capped", "local", "open"]


def test_contention_moves_only_within_a_split_group(monkeypatch):
    monkeypatch.setenv("HUB_POOL_CONTENTION_PLACEMENT", "on")
    node = hub()
    node.load.local = 1
    node.load.local_work = {"ollama": {("other", None): 1}}
    # local is contended and the idle peer no busier than it: a short prompt gives way to it
    short = ctx(tokens=500)
    out, sections = run_stages(pipeline(node), [local(in_flight=1), peer("b", maxPromptTokens=1024)], short, [])
    assert names(out) == ["b", "local"] and sections["contention"]["demoted"][0]["behind"] == ["b"]
    # a long prompt puts the peer in a worse ceiling group: contention does not cross into it
    long = ctx(tokens=2000)
    out, sections = run_stages(pipeline(node), [local(in_flight=1), peer("b", maxPromptTokens=1024)], long, [])
    assert names(out) == ["local", "b"]
    assert sections["promptCeiling"]["excluded"] == [{"node": "b", "maxPromptTokens": 1024}]
    assert sections["contention"]["demoted"][0]["behind"] == []


# -- properties ----------------------------------------------------------------------------

BACKENDS = st.sampled_from(["ollama", "ollama", "llamacpp", "vllm"])
MAYBE_INT = st.one_of(st.none(), st.integers(1, 40_000), st.just(0), st.just(True), st.just("4096"))
PEER_SPEC = st.tuples(BACKENDS, st.integers(0, 6), MAYBE_INT, MAYBE_INT, st.one_of(st.none(), st.integers(1, 6)))


def build_ranking(local_spec, peer_specs):
    """The base ranker's order for a local engine (maybe) and peers: by score, local first on ties."""
    out = []
    if local_spec is not None:
        out.append(local(local_spec[0], in_flight=local_spec[1]))
    for i, (backend, in_flight, cap, ceiling, slots) in enumerate(peer_specs):
        caps = {k: v for k, v in (("maxNumCtx", cap), ("maxPromptTokens", ceiling), ("ollamaSlots", slots))
                if v is not None}
        out.append(peer(f"p{i}", backend, in_flight=in_flight, **caps))
    return sorted(out, key=lambda c: (c.score, c.tier_rank))


LOCAL_SPEC = st.one_of(st.none(), st.tuples(st.sampled_from(["ollama", "vllm"]), st.integers(0, 6)))
ROUTES = st.sampled_from(sorted(ROUTE_CLASS))


@settings(max_examples=200, deadline=None)
@given(LOCAL_SPEC, st.lists(PEER_SPEC, max_size=6), ROUTES, st.integers(1, 50_000),
       st.one_of(st.none(), st.integers(1, 50_000)), st.integers(0, 1), st.booleans())
def test_with_every_knob_off_or_nothing_stated_the_order_is_the_base_rankers(local_spec, specs, route, tokens,
                                                                            num_ctx, aware, strip):
    # knobs off: no local cap, ceiling or slots, and either the slot knob off or no peer stating
    # anything (strip); with the knob off the peers may state what they like, slots never read
    if strip or aware:
        specs = [(backend, in_flight, None, None, None) for backend, in_flight, *_ in specs]
    ranking = build_ranking(local_spec, specs)
    c = ctx(route, settings_=cfg(aware=aware), tokens=tokens, num_ctx=num_ctx)
    before = list(ranking)
    if strip or aware:
        out, sections = run_stages(pipeline(), ranking, c, [])
        assert [id(x) for x in out] == [id(x) for x in before]
        assert sections.get("contextCap") is None and sections.get("promptCeiling") is None
        assert sections.get("slots") is None
        assert "groups" not in c.scratch
    else:  # peers state caps and ceilings, but a window of 1 token fits all of them
        c = ctx(route, settings_=cfg(aware=0), tokens=1, num_ctx=1 if route.startswith("/api/") else None)
        out, _ = run_stages(pipeline(), ranking, c, [])
        assert [id(x) for x in out] == [id(x) for x in before]


def full_pipeline_case(local_spec, specs, route, tokens, num_ctx, knobs):
    cap, ceiling, slots, aware = knobs
    ranking = build_ranking(local_spec, specs)
    c = ctx(route, settings_=cfg(cap=cap, ceiling=ceiling, slots=slots, aware=aware), tokens=tokens,
            num_ctx=num_ctx if route.startswith("/api/") else None)
    return ranking, c


KNOBS = st.tuples(st.one_of(st.none(), st.integers(256, 40_000)), st.one_of(st.none(), st.integers(1024, 40_000)),
                  st.one_of(st.none(), st.integers(1, 6)), st.integers(0, 1))


@settings(max_examples=300, deadline=None)
@given(LOCAL_SPEC, st.lists(PEER_SPEC, max_size=6), ROUTES, st.integers(1, 50_000),
       st.one_of(st.none(), st.integers(1, 50_000)), KNOBS, st.one_of(st.none(), st.integers(-1, 6)))
def test_no_stage_removes_a_candidate_and_a_pin_never_leaves_its_group(local_spec, specs, route, tokens, num_ctx,
                                                                       knobs, pinned):
    ranking, c = full_pipeline_case(local_spec, specs, route, tokens, num_ctx, knobs)
    base = list(ranking)
    pins = []
    if pinned is not None:
        pins = [pin_at("local" if pinned < 0 else f"p{pinned}")]
    out, sections = run_stages(pipeline(), ranking, c, pins)
    assert sorted(map(id, out)) == sorted(map(id, base))  # nothing removed, nothing added
    groups = c.scratch.get("groups")
    if not groups:
        return
    keys = [groups[id(x)] for x in out]
    assert keys == sorted(keys)  # better groups first, pin or not
    assert len({len(k) for k in keys}) == 1
    # within each group: the pinned node's candidates first, the rest in the base ranker's order
    for key in set(keys):
        members = [x for x in out if groups[id(x)] == key]
        hit = [x for x in members if pins and (x.is_local if pins[0].targetKind == "local"
                                               else x.peer_id == pins[0].targetPeerId)]
        rest = [x for x in members if x not in hit]
        assert members == hit + rest
        assert rest == [x for x in base if x in rest]
    # a demoted candidate is never tried first: someone in its own group can take the request
    for name in ("context_cap", "prompt_ceiling", "slots"):
        _, demoted = c.scratch.get(name + "_demoted", (None, []))
        assert all(out[0] is not x for x in demoted)


@settings(max_examples=200, deadline=None)
@given(LOCAL_SPEC, st.lists(PEER_SPEC, max_size=6), ROUTES, st.integers(1, 50_000),
       st.one_of(st.none(), st.integers(1, 50_000)), KNOBS, st.one_of(st.none(), st.integers(-1, 6)))
def test_a_pin_moves_only_within_the_groups_the_unpinned_order_has(local_spec, specs, route, tokens, num_ctx, knobs,
                                                                   pinned):
    ranking, c = full_pipeline_case(local_spec, specs, route, tokens, num_ctx, knobs)
    unpinned, _ = run_stages(pipeline(), list(ranking), c, [])
    groups = dict(c.scratch.get("groups") or {})
    ranking2, c2 = full_pipeline_case(local_spec, specs, route, tokens, num_ctx, knobs)
    pins = [pin_at("local" if (pinned or 0) < 0 else f"p{pinned or 0}")]
    pinned_out, _ = run_stages(pipeline(), ranking2, c2, pins)
    groups2 = c2.scratch.get("groups") or {}
    # the same case twice: the same groups at the same positions; a pin only reorders inside one
    assert [groups.get(id(x)) for x in unpinned] == [groups2.get(id(x)) for x in pinned_out]


@settings(max_examples=200, deadline=None)
@given(LOCAL_SPEC, st.lists(PEER_SPEC, max_size=6), st.integers(2, 50_000), st.sampled_from(["cap", "ceiling",
                                                                                               "slots"]))
def test_when_every_candidate_is_demoted_nothing_moves(local_spec, specs, window, which):
    ranking = build_ranking(local_spec, specs)
    # every candidate judged against the request: cap and ceiling below it, every slot full
    for x in ranking:
        if x.is_local:
            continue
        x.peer.last_capabilities = {"maxNumCtx": window - 1, "maxPromptTokens": window - 1,
                                    "ollamaSlots": max(1, x.in_flight)}
        x.in_flight = max(1, x.in_flight)
    for x in ranking:
        if x.is_local:
            x.in_flight = max(1, x.in_flight)
    slotted_everywhere = all(hub().engine_by_kind.get(x.backend).states_slots for x in ranking)
    knobs = cfg(cap=window - 1, ceiling=window - 1, slots=1, aware=1)
    stage = {"cap": ContextCapStage, "ceiling": PromptCeilingStage, "slots": SlotsStage}[which](hub())
    c = ctx(settings_=knobs, tokens=window, num_ctx=window)
    out, section = stage.apply(list(ranking), c)
    assert [id(x) for x in out] == [id(x) for x in ranking]
    if section is not None:
        assert section.get("excluded", section.get("demoted")) == []
    assert "groups" not in c.scratch
    if which == "slots" and ranking and slotted_everywhere:
        assert section == {"demoted": [], "overridden": False}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.booleans(), st.booleans()), max_size=8))
def test_split_is_a_stable_partition_within_the_groups(rows):
    # rows: (earlier group, judged against, can take it) per candidate, in ranking order
    ranking = [peer(f"p{i}") for i in range(len(rows))]
    spec = {x.node: row for x, row in zip(ranking, rows)}
    c = ctx()
    if rows:
        c.scratch["groups"] = {id(x): (spec[x.node][0],) for x in ranking}
    ranking.sort(key=lambda x: spec[x.node][0])  # an earlier split left them grouped
    out, demoted = split(ranking, c, lambda x: spec[x.node][1], lambda x: spec[x.node][2])
    expect = []
    for g in sorted({r[0] for r in rows}):
        members = [x for x in ranking if spec[x.node][0] == g]
        served = any(not spec[x.node][1] and spec[x.node][2] for x in members)
        expect += [x for x in members if not (spec[x.node][1] and served)]
        expect += [x for x in members if spec[x.node][1] and served]
    assert out == expect
    assert [x for x in ranking if x in demoted] == demoted
    if demoted:
        assert all(c.scratch["groups"][id(x)] == (spec[x.node][0], int(x in demoted)) for x in out)
