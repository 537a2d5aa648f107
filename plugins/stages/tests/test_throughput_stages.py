"""Throughput placement (order 500) and much-faster placement (order 800): one by one, under the
splits and the pin, and as properties (hypothesis)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hubpool_stages import LocalContentionStage, PrefixAffinityStage
from hubpool_stages.splits import ContextCapStage, PromptCeilingStage, SlotsStage
from hubpool_stages.throughput import SlowerPlacementStage, ThroughputStage, slower_settings
from hypothesis import given, settings
from hypothesis import strategies as st

from hubpool_core.placement import Candidate, Load, PlacementContext, run_stages
from hubpool_core.placement.throughput import ThroughputStore

SLOTTED = {"ollama": True, "vllm": False}


@pytest.fixture(autouse=True)
def env(monkeypatch):
    monkeypatch.setenv("HUB_POOL_CONTENTION_PLACEMENT", "off")
    for name in ("HUB_POOL_THROUGHPUT_PLACEMENT", "HUB_POOL_SLOWER_PLACEMENT_RATIO",
                 "HUB_POOL_SLOWER_PLACEMENT_FLOOR_MS"):
        monkeypatch.delenv(name, raising=False)


def hub(store=None):
    engines = {k: SimpleNamespace(kind=k, states_slots=v) for k, v in SLOTTED.items()}
    return SimpleNamespace(throughput=store or ThroughputStore(), engine_by_kind=engines, load=Load(),
                           env=SimpleNamespace(max_prompt_tokens=None))


def cfg(**kw):
    base = dict(maxNumCtx=None, poolMaxPromptTokens=None, ollamaSlots=None, poolSlotAwareness=0, poolLocalAffinity=1,
                poolPrefixAffinityMaxInFlight=0, poolPrefixAffinityMargin=0, poolHealthPollSeconds=10, poolPins=[])
    base.update(kw)
    return SimpleNamespace(**base)


def local(kind="ollama", in_flight=0):
    engine = SimpleNamespace(kind=kind, states_slots=SLOTTED[kind], renders_own_template=True, has_residency=False)
    backend = SimpleNamespace(engine=engine, snapshot=SimpleNamespace(result=SimpleNamespace(models=[])))
    return Candidate("local", kind, local=backend, score=in_flight, in_flight=in_flight)


def peer(name, backend="ollama", in_flight=0, score=None, tier="high", **caps):
    row = SimpleNamespace(id="id-" + name, node_fqdn=name, last_capabilities={"hardwareTier": tier, **caps})
    return Candidate(name, backend, peer=row, score=in_flight + 1 if score is None else score, tier_rank=0,
                     in_flight=in_flight)


def ctx(tokens=40000, budget=None, settings_=None, route="/api/chat"):
    c = PlacementContext(route=route, route_class="chat", model="m", body={"model": "m"}, estimated_tokens=tokens,
                         settings=settings_ or cfg(), judged=route in {"/api/chat", "/v1/chat/completions"})
    c.scratch["budget_ms"] = budget if budget is not None else max(300_000, -(-tokens // 50) * 1000)
    return c


def timed(store, node, ms, tokens=40000, backend="ollama"):
    store.record_prefill(node, backend, "m", tokens, ms)


def names(ranking):
    return [c.node for c in ranking]


def adv(tps, from_tokens=8192, tokens=10000, deadline=False):
    return [{"model": "m", "backend": "ollama", "decode": None,
             "prefill": [{"fromTokens": from_tokens, "promptTokens": tokens, "tokensPerSec": tps,
                          "deadline": deadline, "ageMs": 0}]}]


# -- ThroughputStage ----------------------------------------------------------------------

def test_a_node_predicted_to_miss_moves_behind_every_node_that_is_not():
    s = ThroughputStore()
    timed(s, "slow", 1_500_000)
    timed(s, "fast", 40_000)
    ranking = [peer("slow"), peer("unmeasured"), peer("fast")]
    c = ctx()
    out, section = ThroughputStage(hub(s)).apply(ranking, c)
    assert names(out)[-1] == "slow"
    assert section["estimatedTokens"] == 40000 and section["budgetMs"] == 800_000
    by = {e["node"]: e for e in section["estimates"]}
    assert by["slow"]["slow"] is True and by["fast"]["slow"] is False
    assert by["fast"]["source"] == "observed" and by["fast"]["predictedMs"] == 40000
    assert section["slowerDemoted"] == [] and section["overridden"] is False


def test_all_slow_means_nothing_moves():
    s = ThroughputStore()
    timed(s, "a", 1_500_000)
    timed(s, "b", 1_600_000)
    ranking = [peer("a"), peer("b")]
    out, section = ThroughputStage(hub(s)).apply(ranking, ctx())
    assert out == ranking and all(e["slow"] for e in section["estimates"])


def test_nothing_measured_is_a_null_section_and_small_prompts_are_not_judged():
    ranking = [peer("a"), peer("b")]
    assert ThroughputStage(hub()).apply(ranking, ctx()) == (ranking, None)
    s = ThroughputStore()
    timed(s, "a", 1_500_000)
    assert ThroughputStage(hub(s)).apply(ranking, ctx(tokens=4095)) == (ranking, None)


def test_knob_off_and_unjudged_routes_disable_the_stages(monkeypatch):
    assert ThroughputStage(hub()).enabled(ctx())
    assert not ThroughputStage(hub()).enabled(ctx(route="/v1/embeddings"))
    for value in ("off", "0", "FALSE"):
        monkeypatch.setenv("HUB_POOL_THROUGHPUT_PLACEMENT", value)
        assert not ThroughputStage(hub()).enabled(ctx())
        assert not SlowerPlacementStage(hub()).enabled(ctx())


def test_unmeasured_peers_give_way_to_a_same_score_measured_fast_candidate_for_large_prompts():
    s = ThroughputStore()
    timed(s, "gpu", 30_000, tokens=7731)
    ranking = [peer("cpu", tier="cpu-only"), peer("core-7"), peer("gpu"), peer("busy", in_flight=1)]
    out, section = ThroughputStage(hub(s)).apply(ranking, ctx(tokens=7731))
    assert names(out) == ["gpu", "core-7", "cpu", "busy"]
    assert section["unmeasured"] == [{"node": "core-7", "backend": "ollama", "prior": "unknown"},
                                     {"node": "cpu", "backend": "ollama", "prior": "cpu-only"}]
    # under 6144 an unmeasured peer keeps its place (that is how it gets measured)
    out, section = ThroughputStage(hub(s)).apply(ranking, ctx(tokens=6000))
    assert out == ranking and section["unmeasured"] == []


def test_never_behind_a_busier_node_and_exempt_candidates_keep_their_place():
    s = ThroughputStore()
    timed(s, "gpu", 30_000, tokens=7731)
    ranking = [peer("core-7"), peer("gpu", in_flight=1)]
    assert ThroughputStage(hub(s)).apply(ranking, ctx(tokens=7731))[0] == ranking
    lo = local()
    lo.score = 1
    for setup in (lambda c: None, lambda c: c.scratch.__setitem__("affinity_hold", ("held", "ollama")),
                  lambda c: c.scratch.__setitem__("pinned_nodes", {"held"})):
        ranking = [lo, peer("held"), peer("gpu")]
        c = ctx(tokens=7731)
        setup(c)
        out, _ = ThroughputStage(hub(s)).apply(ranking, c)
        assert out[0] is lo  # the local engine is never deferred
        if c.scratch.get("affinity_hold") or c.scratch.get("pinned_nodes"):
            assert [x.node for x in out] == ["local", "held", "gpu"]  # held and pinned peers neither
    c = ctx(tokens=7731)
    c.scratch["affinity_hold"] = ("held", "ollama")
    ranking = [peer("held"), peer("gpu")]
    assert ThroughputStage(hub(s)).apply(ranking, c)[0] == ranking


def test_an_unmeasured_peer_ranks_ahead_of_a_node_measured_too_slow():
    s = ThroughputStore()
    timed(s, "slow", 1_500_000)
    ranking = [peer("slow"), peer("new")]
    out, section = ThroughputStage(hub(s)).apply(ranking, ctx())
    assert names(out) == ["new", "slow"] and section["unmeasured"] == []


def test_a_peer_cannot_advertise_its_way_out_of_a_missed_deadline():
    s = ThroughputStore()
    s.record_deadline_miss("fzzy", "ollama", "m", 46000, 922_000)
    ranking = [peer("fzzy", throughput=adv(5000.0, from_tokens=32768, tokens=46000)), peer("b")]
    out, section = ThroughputStage(hub(s)).apply(ranking, ctx(tokens=46000, budget=920_000))
    assert names(out) == ["b", "fzzy"]
    assert section["estimates"][-1]["deadline"] is True and section["estimates"][-1]["source"] == "observed"


def test_overridden_when_the_walk_reaches_a_slow_node():
    s = ThroughputStore()
    timed(s, "slow", 1_500_000)
    ranking = [peer("slow"), peer("new")]
    stage = ThroughputStage(hub(s))
    c = ctx()
    out, section = stage.apply(ranking, c)
    stage.placed(c, out[0])
    assert section["overridden"] is False
    stage.failed_over(c, out[1])
    assert section["overridden"] is True


# -- SlowerPlacementStage -----------------------------------------------------------------

def run(store, ranking, c, pins=()):
    node = hub(store)
    stages = [PrefixAffinityStage(node), ContextCapStage(node), PromptCeilingStage(node), SlotsStage(node),
              ThroughputStage(node), LocalContentionStage(node), SlowerPlacementStage(node)]
    return run_stages(stages, ranking, c, list(pins))


def test_much_faster_nodes_go_ahead_in_ranker_order_and_the_new_first_is_judged_again():
    s = ThroughputStore()
    for name, ms in (("core-7", 162_910), ("beta-max", 34_651), ("beta-red", 38_973), ("beta-1", 22_080)):
        timed(s, name, ms, tokens=35809)
    ranking = [peer(n) for n in ("core-7", "beta-max", "beta-red", "beta-1")]
    out, sections = run(s, ranking, ctx(tokens=35809))
    assert names(out) == ["beta-max", "beta-red", "beta-1", "core-7"]
    assert sections["throughput"]["slowerDemoted"] == [
        {"node": "core-7", "backend": "ollama", "predictedMs": 162910, "inFlight": 0, "fasterNode": "beta-max",
         "fasterBackend": "ollama", "fasterMs": 34651, "fasterInFlight": 0}]


def test_ratio_and_floor_both_needed_and_read_per_request(monkeypatch):
    s = ThroughputStore()
    timed(s, "a", 27_000, tokens=8000)
    timed(s, "b", 9_000, tokens=8000)  # 3x but only 18 s sooner
    ranking = [peer("a"), peer("b")]
    assert names(run(s, ranking, ctx(tokens=8000))[0]) == ["a", "b"]
    monkeypatch.setenv("HUB_POOL_SLOWER_PLACEMENT_FLOOR_MS", "10000")
    assert names(run(s, ranking, ctx(tokens=8000))[0]) == ["b", "a"]
    monkeypatch.setenv("HUB_POOL_SLOWER_PLACEMENT_RATIO", "4")
    assert names(run(s, ranking, ctx(tokens=8000))[0]) == ["a", "b"]
    monkeypatch.setenv("HUB_POOL_SLOWER_PLACEMENT_RATIO", "0.5")  # below 1: the default
    monkeypatch.setenv("HUB_POOL_SLOWER_PLACEMENT_FLOOR_MS", "-1")
    assert slower_settings() == (3.0, 20000.0)


def test_a_busier_faster_node_goes_ahead_only_with_a_free_slot():
    s = ThroughputStore()
    timed(s, "cpu", 160_000)
    timed(s, "gpu", 20_000)
    ranking = [peer("cpu"), peer("gpu", in_flight=1)]
    assert names(run(s, ranking, ctx())[0]) == ["cpu", "gpu"]
    ranking = [peer("cpu"), peer("gpu", in_flight=1, ollamaSlots=2)]
    assert names(run(s, ranking, ctx())[0]) == ["gpu", "cpu"]
    ranking = [peer("cpu"), peer("gpu", in_flight=2, ollamaSlots=4)]
    assert names(run(s, ranking, ctx())[0]) == ["cpu", "gpu"]


def test_unmeasured_front_pins_holds_deadlines_and_small_prompts_leave_the_order():
    s = ThroughputStore()
    timed(s, "cpu", 160_000)
    timed(s, "gpu", 20_000)
    ranking = [peer("new"), peer("cpu"), peer("gpu")]
    c = ctx()
    c.scratch["affinity_hold"] = ("new", "ollama")  # keeps "new" from being deferred
    assert names(run(s, ranking, c)[0])[0] == "new"
    c = ctx()
    c.scratch["affinity_hold"] = ("cpu", "ollama")
    assert names(run(s, [peer("cpu"), peer("gpu")], c)[0]) == ["cpu", "gpu"]
    pin = SimpleNamespace(scope="default", model=None, mode="prefer", targetKind="peer", targetPeerId="id-cpu")
    ranking = [peer("gpu"), peer("cpu")]
    assert names(run(s, ranking, ctx(settings_=cfg(poolPins=[pin])), pins=[pin])[0]) == ["cpu", "gpu"]
    s2 = ThroughputStore()
    s2.record_prefill("cpu", "ollama", "m", 6000, 60_000)
    s2.record_prefill("gpu", "ollama", "m", 6000, 1_000)
    assert names(run(s2, [peer("cpu"), peer("gpu")], ctx(tokens=6000))[0]) == ["cpu", "gpu"]
    s3 = ThroughputStore()
    timed(s3, "cpu", 160_000)
    s3.record_deadline_miss("gpu", "ollama", "m", 40000, 20_000)
    assert names(run(s3, [peer("cpu"), peer("gpu")], ctx())[0]) == ["cpu", "gpu"]


def test_the_rest_of_the_walk_is_judged_too_without_slower_demoted_rows():
    s = ThroughputStore()
    for name, ms in (("a", 20_000), ("b", 160_000), ("c", 30_000)):
        timed(s, name, ms)
    ranking = [peer("a"), peer("b"), peer("c")]
    out, sections = run(s, ranking, ctx())
    assert names(out) == ["a", "c", "b"] and sections["throughput"]["slowerDemoted"] == []


# -- properties ---------------------------------------------------------------------------

NODES = ["local", "p1", "p2", "p3", "p4", "p5"]
rates = st.one_of(st.none(), st.sampled_from([20.0, 60.0, 150.0, 500.0, 1500.0]))


@st.composite
def worlds(draw):
    n = draw(st.integers(1, 6))
    out = []
    for name in NODES[:n]:
        out.append(dict(name=name, in_flight=draw(st.integers(0, 2)), rate=draw(rates),
                        cap=draw(st.sampled_from([None, 8192, 65536])), deadline=draw(st.booleans()),
                        tier=draw(st.sampled_from(["high", "cpu-only", "low"])),
                        slots=draw(st.sampled_from([None, 1, 4]))))
    tokens = draw(st.sampled_from([4000, 6000, 8000, 40000, 120000]))
    pin = draw(st.sampled_from([None] + NODES[:n]))
    return out, tokens, pin


def build(world, tokens, store):
    ranking = []
    for w in world:
        if w["name"] == "local":
            c = local(in_flight=w["in_flight"])
        else:
            c = peer(w["name"], in_flight=w["in_flight"], tier=w["tier"],
                     **({"maxNumCtx": w["cap"]} if w["cap"] else {}),
                     **({"ollamaSlots": w["slots"]} if w["slots"] else {}))
        ranking.append(c)
        if w["rate"] is not None:
            if w["deadline"]:
                store.record_deadline_miss(w["name"], "ollama", "m", max(tokens, 4096),
                                           int(max(tokens, 4096) / w["rate"] * 1000))
            else:
                store.record_prefill(w["name"], "ollama", "m", max(tokens, 4096), max(tokens, 4096) / w["rate"] * 1000)
    ranking.sort(key=lambda c: (c.score, c.tier_rank))
    return ranking


def pin_for(name):
    if name is None:
        return []
    kind = "local" if name == "local" else "peer"
    return [SimpleNamespace(scope="default", model=None, mode="prefer", targetKind=kind,
                            targetPeerId=None if kind == "local" else "id-" + name)]


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_no_candidate_is_ever_removed(world):
    spec, tokens, pin = world
    s = ThroughputStore()
    ranking = build(spec, tokens, s)
    pins = pin_for(pin)
    out, _ = run(s, ranking, ctx(tokens=tokens, settings_=cfg(poolPins=pins)), pins)
    assert sorted(map(id, out)) == sorted(map(id, ranking))


@settings(max_examples=200, deadline=None)
@given(worlds())
def test_knob_off_or_nothing_measured_is_the_base_order(world):
    spec, tokens, _ = world
    s = ThroughputStore()
    ranking = build(spec, tokens, s)
    c = ctx(tokens=tokens)
    without = run_stages([], list(ranking), ctx(tokens=tokens), [])[0]
    unmeasured = run(ThroughputStore(), list(ranking), c)[0]
    assert names(unmeasured) == names(run_stages([ContextCapStage(hub())], list(ranking), ctx(tokens=tokens), [])[0])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HUB_POOL_THROUGHPUT_PLACEMENT", "off")
        node = hub(s)
        off = run_stages([ThroughputStage(node), SlowerPlacementStage(node)], list(ranking), ctx(tokens=tokens), [])[0]
    assert names(off) == names(without)


@settings(max_examples=200, deadline=None)
@given(worlds())
def test_all_slow_means_nothing_moves_property(world):
    spec, tokens, _ = world
    tokens = max(tokens, 4096)
    for w in spec:
        w["rate"], w["deadline"], w["cap"] = 1.0, False, None
    s = ThroughputStore()
    ranking = build(spec, tokens, s)
    node = hub(s)
    out = run_stages([ThroughputStage(node), SlowerPlacementStage(node)], list(ranking), ctx(tokens=tokens), [])[0]
    assert names(out) == names(ranking)


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_a_pin_never_brings_a_node_out_of_a_worse_group(world):
    spec, tokens, pin = world
    s = ThroughputStore()
    ranking = build(spec, tokens, s)
    pins = pin_for(pin)
    c = ctx(tokens=tokens, settings_=cfg(poolPins=pins))
    out, _ = run(s, ranking, c, pins)
    groups = c.scratch.get("groups") or {}
    keys = [groups.get(id(x), ()) for x in out]
    assert keys == sorted(keys)
