"""Properties of the base ranker and pins (hypothesis): nothing dropped or invented, the
pressure key absent at weight 0, local taking exact ties, pins reordering only."""

from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from hubpool_core.models_ids import fold_model_id
from hubpool_core.placement import Load, apply_pin, build_candidates
from hubpool_core.store import PoolPeer


def peer(i, band, reported, tier, models=("m",)):
    caps = {"hardwareTier": tier, "acceptingWork": True, "inFlightRequests": reported,
            "backends": [{"type": "vllm", "healthy": True, "modelsLoaded": list(models)}]}
    if band is not None:
        caps["gpuPressure"] = band
    return PoolPeer(id=f"p{i}", node_fqdn=f"n{i}.example.ts.net", direction="outbound", status="connected",
                    enabled=True, last_capabilities=caps, last_seen_at=datetime.now(timezone.utc))


def local_backend(models=("m",)):
    engine = SimpleNamespace(kind="ollama")
    result = SimpleNamespace(models=[SimpleNamespace(id=m) for m in models])
    return SimpleNamespace(engine=engine, healthy=True, snapshot=SimpleNamespace(result=result),
                           lists=lambda model: model in models)


peers_strategy = st.lists(st.tuples(st.one_of(st.none(), st.integers(-1, 5), st.just("2")),
                                    st.one_of(st.none(), st.integers(0, 9)),
                                    st.sampled_from(["high", "medium", "low", "cpu-only", "weird", None])),
                          max_size=6)


@settings(max_examples=200, deadline=None)
@given(peers_strategy, st.integers(0, 5), st.integers(0, 3), st.integers(0, 20), st.booleans())
def test_ranking_is_a_permutation_and_weight_zero_ignores_pressure(specs, local_load, weight, affinity, with_local):
    peers = [peer(i, *spec) for i, spec in enumerate(specs)]
    load = Load()
    load.local = local_load
    local = [local_backend()] if with_local else []
    ranking = build_candidates("m", local, peers, load, local_affinity=affinity, pressure_weight=weight,
                               poll_seconds=30)
    assert sorted(c.node for c in ranking) == sorted(["local"] * len(local) + [p.node_fqdn for p in peers])
    if weight == 0:
        flat = [peer(i, None, s[1], s[2]) for i, s in enumerate(specs)]
        again = build_candidates("m", local, flat, load, local_affinity=affinity, pressure_weight=0,
                                 poll_seconds=30)
        assert [c.node for c in again] == [c.node for c in ranking]


@given(st.integers(0, 5), st.integers(0, 20))
def test_local_takes_an_exact_tie(load_value, affinity):
    load = Load()
    load.local = load_value + affinity
    p = peer(0, None, load_value, "high")
    ranking = build_candidates("m", [local_backend()], [p], load, local_affinity=affinity, pressure_weight=0,
                               poll_seconds=30)
    assert ranking[0].node == "local"


def test_a_peer_claiming_zero_pressure_is_floored_by_what_we_forwarded():
    # equal queues (two each); the liar claims an idle GPU, the honest peer cannot measure
    liar, honest = peer(0, 0, None, "low"), peer(1, None, 2, "low")
    load = Load()
    load.forwarded[liar.id] = 2
    ranking = build_candidates("m", [], [liar, honest], load, local_affinity=1, pressure_weight=1, poll_seconds=30)
    assert [c.node for c in ranking] == [honest.node_fqdn, liar.node_fqdn]
    assert ranking[1].pressure == 2  # the claimed 0 is floored by the two requests we forwarded
    # with nothing forwarded there, the same claim of 0 would win: the floor is what stops it
    unloaded = peer(0, 0, 2, "low")
    ranking = build_candidates("m", [], [unloaded, honest], Load(), local_affinity=1, pressure_weight=1,
                               poll_seconds=30)
    assert ranking[0].node == unloaded.node_fqdn


@given(st.lists(st.integers(0, 5), min_size=1, max_size=6), st.integers(0, 6), st.booleans())
def test_a_pin_only_reorders(loads, target, pin_local):
    peers = [peer(i, None, load, "low") for i, load in enumerate(loads)]
    ranking = build_candidates("m", [local_backend()], peers, Load(), local_affinity=1, pressure_weight=0,
                               poll_seconds=30)
    pin = SimpleNamespace(scope="default", model=None, mode="prefer", targetKind="local" if pin_local else "peer",
                          targetPeerId=None if pin_local else f"p{target}")
    result = apply_pin(ranking, [pin], "m")
    assert sorted(id(c) for c in result.ranking) == sorted(id(c) for c in ranking)
    rest = [c for c in result.ranking if not (c.is_local if pin_local else c.peer_id == pin.targetPeerId)]
    assert rest == [c for c in ranking if c in rest]  # everyone else keeps the ranker's order
    hit = [c for c in ranking if (c.is_local if pin_local else c.peer_id == pin.targetPeerId)]
    assert result.ranking[: len(hit)] == hit


@settings(max_examples=100, deadline=None)
@given(peers_strategy, st.integers(0, 5), st.booleans(), st.text(max_size=40))
def test_with_affinity_0_and_contention_off_placement_is_the_base_rankers(specs, local_load, with_local, prompt):
    import os

    from hubpool_stages import LocalContentionStage, PrefixAffinityStage

    from hubpool_core.placement import PlacementContext, run_stages

    peers = [peer(i, *spec) for i, spec in enumerate(specs)]
    load = Load()
    load.local = local_load
    load.local_work = {"ollama": {("other-model", None): 1}}  # contention would have something to say
    node = SimpleNamespace(load=load, settings=SimpleNamespace(current=SimpleNamespace(maxNumCtx=None)))
    settings_ = SimpleNamespace(poolPrefixAffinityMaxInFlight=0, poolPrefixAffinityMargin=0, maxNumCtx=None)
    local = [local_backend()] if with_local else []
    ranking = build_candidates("m", local, peers, load, local_affinity=1, pressure_weight=0, poll_seconds=30)
    affinity, contention = PrefixAffinityStage(node), LocalContentionStage(node)
    ctx = PlacementContext(route="/api/chat", route_class="chat", model="m", estimated_tokens=10,
                           settings=settings_, judged=True,
                           body={"model": "m", "messages": [{"role": "user", "content": prompt}]})
    old = os.environ.get("HUB_POOL_CONTENTION_PLACEMENT")
    os.environ["HUB_POOL_CONTENTION_PLACEMENT"] = "off"
    try:
        ordered, sections = run_stages([affinity, contention], list(ranking), ctx, [])
    finally:
        if old is None:
            os.environ.pop("HUB_POOL_CONTENTION_PLACEMENT")
        else:
            os.environ["HUB_POOL_CONTENTION_PLACEMENT"] = old
    assert [id(c) for c in ordered] == [id(c) for c in ranking]
    assert sections == {"pin": None}
    assert "affinity_session" not in ctx.scratch and "affinity_key" not in ctx.scratch  # nothing hashed
    assert len(affinity.table) == 0  # nothing remembered


_NAMES = st.sampled_from(["qwen3", "gpt-oss", "deepseek-v3.1", "nomic-embed-text", "bge-m3", "gemma3", "mystery"])
_TAGS = st.sampled_from(["", ":8b", ":70b", ":1b", ":3b", ":cloud", ":120b-cloud", ":671b-cloud", ":latest",
                         ":e4b", ":cloudy", ":14b-q4"])
_OFFERS = st.dictionaries(st.builds(lambda n, t: n + t, _NAMES, _TAGS),
                          st.sets(st.sampled_from(["local", "hub-b", "hub-c"]), min_size=1), max_size=8)


@given(_OFFERS, st.none() | st.builds(lambda n, t: n + t, _NAMES, _TAGS))
def test_auto_never_chooses_a_cloud_tag_or_a_non_chat_model_and_orders_by_size_tier(offers, preferred):
    """Issue 16.3/16.4: the ranking never picks an Ollama Cloud tag or an embedding model; a
    preference that is a chat model the pool serves wins; 7 B+, then unknown size, then smaller."""
    from hubpool_core.placement.auto import _params_b, choose_auto_model, is_chat_model, is_cloud_tag

    chosen = choose_auto_model(offers, preferred)
    if preferred and is_chat_model(preferred) and any(fold_model_id(m) == fold_model_id(preferred) for m in offers):
        assert fold_model_id(chosen) == fold_model_id(preferred)
        return
    eligible = [m for m in offers if is_chat_model(m) and not is_cloud_tag(m)]
    assert (chosen is None) == (not eligible)
    if chosen is None:
        return
    assert not is_cloud_tag(chosen) and is_chat_model(chosen)

    def tier(m):
        p = _params_b(m)
        return 1 if p is None else (0 if p >= 7 else 2)

    assert tier(chosen) == min(tier(m) for m in eligible)


def test_cloud_tags_are_the_tag_ending_in_cloud():
    from hubpool_core.placement.auto import is_cloud_tag

    assert all(is_cloud_tag(m) for m in ("gpt-oss:120b-cloud", "deepseek-v3.1:671b-cloud", "kimi:cloud",
                                         "ns/qwen3-coder:480b-CLOUD"))
    assert not any(is_cloud_tag(m) for m in ("cloud", "cloud-model:8b", "qwen3:cloudy", "x:8b-cloudburst",
                                             "registry:5000/cloud"))


_SIZE = st.one_of(st.integers(min_value=1, max_value=999).map(str),
                  st.builds(lambda a, b: f"{a}.{b}", st.integers(0, 99), st.integers(1, 9)))


@given(name=st.sampled_from(["qwen3", "qwen3-coder", "ns/qwen3", "granite4"]), total=_SIZE, active=_SIZE,
       case=st.sampled_from(["b", "B"]), sep=st.sampled_from([":", "-"]),
       suffix=st.sampled_from(["", "-instruct", "-q4_K_M", "-instruct-2507"]))
def test_a_mixture_of_experts_tag_is_sized_by_its_total(name, total, active, case, sep, suffix):
    """Issue 26.14: qwen3:30b-a3b was read as 3 B (its active count), so auto picked
    llama3.1:8b over it. The size is the total, whatever the active count says."""
    from hubpool_core.placement.auto import _params_b

    a = "a" if case == "b" else "A"
    assert _params_b(f"{name}{sep}{total}{case}-{a}{active}{case}{suffix}") == float(total)
    assert _params_b(f"{name}{sep}{total}{case}{suffix}") == float(total)
