"""Local engine contention: who gives up the head start, to whom, and the affinity exemption."""

from __future__ import annotations

import pytest
from hubpool_stages import hubpool_register_stages
from hubpool_stages.affinity import PrefixAffinityStage
from hubpool_stages.contention import LocalContentionStage, blocking_work, contention_on
from hypothesis import given, settings
from hypothesis import strategies as st

from hubpool_core.placement import run_stages

BIG, SMALL = "qwen3.6:35b", "qwen3.8:27b"


@pytest.fixture(autouse=True)
def contention_default(monkeypatch):
    monkeypatch.delenv("HUB_POOL_CONTENTION_PLACEMENT", raising=False)


def judge(build, ranking, node, ctx):
    stage = LocalContentionStage(node)
    assert stage.enabled(ctx)
    return stage.apply(ranking, ctx)


def test_the_hook_registers_every_stage_in_order():
    from hubpool_stages.splits import ContextCapStage, PromptCeilingStage, SlotsStage
    from hubpool_stages.throughput import SlowerPlacementStage, ThroughputStage
    from hubpool_stages.ttft import PredictedTtftStage

    got = []
    hubpool_register_stages(register=got.append)
    assert got == [PredictedTtftStage, PrefixAffinityStage, ContextCapStage, PromptCeilingStage, SlotsStage, ThroughputStage,
                   LocalContentionStage, SlowerPlacementStage]
    assert [cls.order for cls in got] == sorted(cls.order for cls in got)
    assert LocalContentionStage.order == 600 and LocalContentionStage.section == "contention"


def test_beta_max_a_local_engine_busy_with_another_model_gives_way_to_a_free_peer(build):
    # spec: beta-max 2026-09-26 23:50Z, a 35b turn sat out 327 s behind OpenClaw's 27b turn
    node = build.node(local_in_flight=1, work={"ollama": {(SMALL, None): 1}})
    ranking = [build.local(models=(BIG, SMALL), in_flight=1), build.peer("core-2", in_flight=0)]
    ctx = build.context(model=BIG, cfg=build.settings(head_start=1, cap=32768))
    out, section = judge(build, ranking, node, ctx)
    assert build.nodes(out) == [("core-2", "ollama"), ("local", "ollama")]
    assert section == {"numCtx": None, "overridden": False, "demoted": [
        {"node": "local", "backend": "ollama", "busyWith": [{"model": SMALL, "numCtx": 32768}], "runsAt": 32768,
         "behind": ["core-2"], "overriddenBy": None}]}


def test_beta_max_the_same_model_at_another_window_and_another_model(build):
    # the 35b at 65536 asked while Ollama held it at its 32768 default for two /v1 requests
    node = build.node(local_in_flight=3, work={"ollama": {(BIG, None): 2, (SMALL, None): 1}})
    ranking = [build.local(models=(BIG, SMALL), in_flight=3), build.peer("core-2", in_flight=2)]
    ctx = build.context(model=BIG, num_ctx=65536, cfg=build.settings(head_start=1, cap=32768))
    out, section = judge(build, ranking, node, ctx)
    assert out[0].node == "core-2"
    entry = section["demoted"][0]
    assert entry["busyWith"] == [{"model": BIG, "numCtx": 32768}, {"model": SMALL, "numCtx": 32768}]
    assert entry["runsAt"] == 65536 and section["numCtx"] == 65536


def test_work_the_request_can_join_is_no_contention(build):
    node = build.node(local_in_flight=2, work={"ollama": {(BIG, None): 1, (BIG + ":latest", 32768): 0}})
    ranking = [build.local(models=(BIG,), in_flight=2), build.peer("b", in_flight=1)]
    assert judge(build, ranking, node, build.context(model=BIG, cfg=build.settings(cap=32768))) == (ranking, None)
    # a named window equal to the node's stated default joins the default's runner
    assert judge(build, ranking, node, build.context(model=BIG, num_ctx=32768,
                                                     cfg=build.settings(cap=32768)))[1] is None


def test_without_a_cap_no_window_matches_no_window_but_not_a_number(build):
    node = build.node(local_in_flight=1, work={"ollama": {("m", None): 1}})
    ranking = [build.local(in_flight=1), build.peer("b", in_flight=0)]
    assert judge(build, ranking, node, build.context())[1] is None
    out, section = judge(build, ranking, node, build.context(num_ctx=8192))
    assert section["demoted"][0]["busyWith"] == [{"model": "m", "numCtx": None}] and out[0].node == "b"


def test_an_engine_with_a_fixed_window_joins_its_model_at_any_named_window(build):
    node = build.node(local_in_flight=1, work={"vllm": {("m", None): 1}})
    ranking = [build.local("vllm", windowed=False, residency=False, window=16384, in_flight=1),
               build.peer("b", in_flight=0)]
    assert judge(build, ranking, node, build.context(num_ctx=65536))[1] is None
    node.load.local_work["vllm"][("other", None)] = 1
    _, section = judge(build, ranking, node, build.context(num_ctx=65536))
    # the listing states no window for a model it does not list, and 16384 for this one
    assert section["demoted"][0]["busyWith"] == [{"model": "other", "numCtx": None}]
    assert section["demoted"][0]["runsAt"] == 16384


def test_it_moves_behind_candidates_no_busier_and_stops_at_the_first_busier(build):
    node = build.node(local_in_flight=2, work={"ollama": {("other", None): 2}})
    ranking = [build.local(in_flight=2), build.peer("tie", in_flight=2), build.peer("less", in_flight=1),
               build.peer("busier", in_flight=3), build.peer("idle", in_flight=0)]
    out, section = judge(build, ranking, node, build.context())
    assert [c.node for c in out] == ["tie", "less", "local", "busier", "idle"]
    assert section["demoted"][0]["behind"] == ["tie", "less"]


def test_kept_first_when_every_node_after_it_is_busier(build):
    node = build.node(local_in_flight=1, work={"ollama": {("other", None): 1}})
    ranking = [build.local(in_flight=1), build.peer("b", in_flight=3)]
    out, section = judge(build, ranking, node, build.context())
    assert out == ranking
    assert section["demoted"][0]["behind"] == [] and section["demoted"][0]["overriddenBy"] is None


def test_a_move_never_crosses_a_placement_group(build):
    node = build.node(local_in_flight=1, work={"ollama": {("other", None): 1}})
    ranking = [build.local(in_flight=1), build.peer("same", in_flight=0), build.peer("over-cap", in_flight=0)]
    ctx = build.context()
    ctx.scratch["groups"] = {id(ranking[0]): 0, id(ranking[1]): 0, id(ranking[2]): 1}
    out, _ = judge(build, ranking, node, ctx)
    assert [c.node for c in out] == ["same", "local", "over-cap"]


def test_only_with_a_peer_candidate_and_only_on_judged_routes(build, monkeypatch):
    node = build.node(local_in_flight=1, work={"ollama": {("other", None): 1}})
    stage = LocalContentionStage(node)
    only_local = [build.local(in_flight=1)]
    assert stage.apply(only_local, build.context()) == (only_local, None)
    assert not stage.enabled(build.context("/v1/embeddings", {"input": "x"}))
    for off in ("off", "0", "false", "OFF", " False "):
        monkeypatch.setenv("HUB_POOL_CONTENTION_PLACEMENT", off)
        assert not stage.enabled(build.context()) and not contention_on({"HUB_POOL_CONTENTION_PLACEMENT": off})
    monkeypatch.setenv("HUB_POOL_CONTENTION_PLACEMENT", "on")
    assert stage.enabled(build.context())


def test_failover_reaching_an_engine_that_gave_way_overrides_the_demotion(build):
    node = build.node(local_in_flight=1, work={"ollama": {("other", None): 1}})
    ranking = [build.local(in_flight=1), build.peer("b", in_flight=0)]
    ctx = build.context()
    stage = LocalContentionStage(node)
    out, section = stage.apply(ranking, ctx)
    stage.placed(ctx, out[0])
    assert section["overridden"] is False
    stage.failed_over(ctx, out[1])
    assert section["overridden"] is True


# -- the affinity exemption -------------------------------------------------------------

def held_context(build, resident, **kw):
    ctx = build.context(model=BIG, cfg=build.settings(limit=2, cap=32768), **kw)
    ctx.scratch["affinity_hold"] = ("local", "ollama")
    if resident is not None:
        ctx.scratch["resident"] = resident
    return ctx


def test_the_engine_affinity_holds_keeps_its_place_while_the_prefix_is_warm(build):
    # spec: core-2, a ~30k-token Hermes turn moved cold to an idle leaf beside OpenClaw's 27b turn
    node = build.node(local_in_flight=1, work={"ollama": {(SMALL, None): 1}})
    ranking = [build.local(models=(BIG, SMALL), in_flight=1), build.peer("leaf", in_flight=0)]
    out, section = judge(build, ranking, node, held_context(build, {"ollama": [BIG, SMALL]}))
    assert out == ranking
    assert section["demoted"][0]["behind"] == [] and section["demoted"][0]["overriddenBy"] == "affinity"


@pytest.mark.parametrize("resident", [None, {"ollama": None}, {"ollama": [SMALL]}, {"vllm": [BIG]}])
def test_not_held_when_residency_is_unknown_or_does_not_show_the_model(build, resident):
    node = build.node(local_in_flight=1, work={"ollama": {(SMALL, None): 1}})
    ranking = [build.local(models=(BIG, SMALL), in_flight=1), build.peer("leaf", in_flight=0)]
    out, section = judge(build, ranking, node, held_context(build, resident))
    assert out[0].node == "leaf" and section["demoted"][0]["overriddenBy"] is None


def test_not_held_when_the_model_runs_there_at_another_window(build):
    node = build.node(local_in_flight=2, work={"ollama": {(SMALL, None): 1, (BIG, 65536): 1}})
    ranking = [build.local(models=(BIG, SMALL), in_flight=2), build.peer("leaf", in_flight=1)]
    out, section = judge(build, ranking, node, held_context(build, {"ollama": [BIG, SMALL]}))
    assert out[0].node == "leaf" and section["demoted"][0]["behind"] == ["leaf"]


def test_an_engine_with_no_residency_api_is_read_by_its_inventory(build):
    node = build.node(local_in_flight=1, work={"vllm": {(SMALL, None): 1}})
    ranking = [build.local("vllm", windowed=False, residency=False, models=(BIG, SMALL), in_flight=1),
               build.peer("leaf", in_flight=0)]
    ctx = held_context(build, None)
    ctx.scratch["affinity_hold"] = ("local", "vllm")
    out, section = judge(build, ranking, node, ctx)
    assert out == ranking and section["demoted"][0]["overriddenBy"] == "affinity"


def test_a_hold_on_a_peer_or_another_engine_exempts_nothing(build):
    node = build.node(local_in_flight=1, work={"ollama": {(SMALL, None): 1}})
    ranking = [build.local(models=(BIG, SMALL), in_flight=1), build.peer("leaf", in_flight=0)]
    for hold in (("leaf", "ollama"), ("local", "llamacpp")):
        ctx = held_context(build, {"ollama": [BIG]})
        ctx.scratch["affinity_hold"] = hold
        assert judge(build, ranking, node, ctx)[0][0].node == "leaf"


def test_residency_is_asked_only_for_a_held_contended_engine_that_can_tell(build, monkeypatch):
    node = build.node(local_in_flight=1, work={"ollama": {(SMALL, None): 1}})
    affinity = PrefixAffinityStage(node)
    ranking = [build.local(models=(BIG, SMALL), in_flight=1), build.peer("leaf", in_flight=0)]
    ctx = build.context(model=BIG, cfg=build.settings(limit=2), session="s")
    assert affinity.wants_residency(ranking, ctx) == []  # nothing remembered
    affinity.table.remember(ctx.scratch.get("affinity_key") or _key(ctx), "local", "ollama")
    assert affinity.wants_residency(ranking, ctx) == ["ollama"]
    monkeypatch.setenv("HUB_POOL_CONTENTION_PLACEMENT", "off")
    assert affinity.wants_residency(ranking, ctx) == []
    monkeypatch.delenv("HUB_POOL_CONTENTION_PLACEMENT")
    assert affinity.wants_residency(ranking[:1], ctx) == []  # no peer: contention will not judge
    node.load.local_work["ollama"] = {(BIG, None): 1}
    assert affinity.wants_residency(ranking, ctx) == []  # not contended: joins its own model's work
    node.load.local_work["ollama"] = {(SMALL, None): 1, (BIG, 65536): 1}
    assert affinity.wants_residency(ranking, ctx) == []  # another window: cold whatever residency says
    node.load.local_work["ollama"] = {(SMALL, None): 1}
    node.load.local = 5
    assert affinity.wants_residency(ranking, ctx) == []  # over the limit: affinity stands aside


def _key(ctx):
    from hubpool_stages.affinity import session_key

    return session_key(ctx)[1]


def test_affinity_then_contention_through_the_pipeline(build):
    node = build.node(local_in_flight=1, work={"ollama": {(SMALL, None): 1}})
    stages = [PrefixAffinityStage(node), LocalContentionStage(node)]
    ranking = [build.local(models=(BIG, SMALL), in_flight=1), build.peer("leaf", in_flight=0)]
    ctx = build.context(model=BIG, cfg=build.settings(limit=2), session="hermes-1")
    stages[0].table.remember(_key(ctx), "local", "ollama")
    ctx.scratch["resident"] = {"ollama": [BIG]}
    out, sections = run_stages(stages, list(ranking), ctx, [])
    for stage in stages:
        stage.placed(ctx, out[0])
    assert out[0].node == "local"
    assert sections["affinity"]["outcome"] == "hit" and sections["affinity"]["qualified"] is True
    assert sections["contention"]["demoted"][0]["overriddenBy"] == "affinity"
    # evicted: the hold is refused, contention moves it, and affinity reads skipped with qualified true
    ctx = build.context(model=BIG, cfg=build.settings(limit=2), session="hermes-1")
    ctx.scratch["resident"] = {"ollama": [SMALL]}
    out, sections = run_stages(stages, list(ranking), ctx, [])
    for stage in stages:
        stage.placed(ctx, out[0])
    assert out[0].node == "leaf"
    assert (sections["affinity"]["outcome"], sections["affinity"]["qualified"]) == ("skipped", True)
    assert ctx.response_headers["X-Hub-Pool-Affinity"] == "skipped"
    assert sections["contention"]["demoted"][0]["behind"] == ["leaf"]


# -- properties ---------------------------------------------------------------------

specs = st.lists(st.tuples(st.sampled_from(["local", "a", "b", "c"]), st.sampled_from(["ollama", "vllm"]),
                           st.integers(0, 6)), max_size=6)
work = st.dictionaries(st.sampled_from(["ollama", "vllm"]),
                       st.dictionaries(st.tuples(st.sampled_from(["m", "m:latest", "x"]),
                                                 st.sampled_from([None, 2048, 8192])), st.integers(0, 3)),
                       max_size=2)


def _ranking(build, specs):
    return [build.local(kind, windowed=kind == "ollama", in_flight=n) if name == "local"
            else build.peer(name, kind, in_flight=n) for name, kind, n in specs]


@settings(max_examples=200, deadline=None)
@given(specs=specs, work=work, num_ctx=st.sampled_from([None, 2048, 8192]), cap=st.sampled_from([None, 8192]),
       hold=st.sampled_from([None, ("local", "ollama"), ("a", "vllm")]))
def test_apply_never_adds_or_removes_and_only_local_engines_move_back(build, specs, work, num_ctx, cap, hold):
    node = build.node(local_in_flight=sum(n for name, _, n in specs if name == "local"), work=work)
    ranking = _ranking(build, specs)
    ctx = build.context(num_ctx=num_ctx, cfg=build.settings(cap=cap))
    if hold:
        ctx.scratch["affinity_hold"] = hold
    out, section = LocalContentionStage(node).apply(list(ranking), ctx)
    assert sorted(map(id, out)) == sorted(map(id, ranking))
    peers_before = [id(c) for c in ranking if not c.is_local]
    assert [id(c) for c in out if not c.is_local] == peers_before  # peers keep their order
    for entry in (section or {}).get("demoted", []):
        assert entry["node"] == "local" and (entry["behind"] == [] or entry["overriddenBy"] is None)


@settings(max_examples=150, deadline=None)
@given(specs=specs, work=work, num_ctx=st.sampled_from([None, 8192]))
def test_with_contention_off_the_order_is_unchanged(build, specs, work, num_ctx):
    node = build.node(local_in_flight=3, work=work)
    ranking = _ranking(build, specs)
    ctx = build.context(num_ctx=num_ctx)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HUB_POOL_CONTENTION_PLACEMENT", "off")
        out, sections = run_stages([LocalContentionStage(node)], list(ranking), ctx, [])
    assert [id(c) for c in out] == [id(c) for c in ranking] and "contention" not in sections


@given(work=work)
def test_busy_with_lists_only_work_that_cannot_be_joined(build, work):
    node = build.node(work=work)
    cand = build.local()
    ctx = build.context(num_ctx=8192)
    for entry in blocking_work(cand, ctx, node.load):
        assert entry["model"] == "x" or entry["numCtx"] != 8192
