"""Predicted time to first token (hypothesis): with ``poolTtftRanking`` 0 the pipeline's order
is the spec's exactly; with it on, a permutation in which candidates without evidence keep
their queue-depth places and the others are ordered by prediction; affinity re-asked."""

from __future__ import annotations

from types import SimpleNamespace

from hubpool_stages import (
    ContextCapStage,
    LocalContentionStage,
    PredictedTtftStage,
    PrefixAffinityStage,
    PromptCeilingStage,
    SlotsStage,
    SlowerPlacementStage,
    ThroughputStage,
)
from hubpool_stages.ttft import SPREAD_MIN_TOKENS
from hypothesis import given, settings
from hypothesis import strategies as st

from hubpool_core.placement import Candidate, Load, PlacementContext, run_stages
from hubpool_core.placement.hops import HopTimes
from hubpool_core.placement.speed import ResidencyView, SpeedBook

ALL = (PredictedTtftStage, PrefixAffinityStage, ContextCapStage, PromptCeilingStage, SlotsStage, ThroughputStage,
       LocalContentionStage, SlowerPlacementStage)
ENGINE = SimpleNamespace(kind="eng", states_slots=True, renders_own_template=False, has_residency=False)


def make_node(book, view=None, hops=None):
    return SimpleNamespace(load=Load(), speed=book, residency=view or ResidencyView(), engine_by_kind={"eng": ENGINE},
                           throughput=None, env=None, hops=hops or HopTimes())


def cfg(on, **extra):
    values = dict(poolTtftRanking=1 if on else 0, poolPrefixAffinityMaxInFlight=0, poolPrefixAffinityMargin=0,
                  poolLocalAffinity=1, poolSlotAwareness=0, poolPins=[], maxNumCtx=None, ollamaSlots=None,
                  poolMaxPromptTokens=None, poolHealthPollSeconds=30)
    values.update(extra)
    return SimpleNamespace(**values)


def ctx(settings_, tokens=2000, session=None):
    return PlacementContext(route="/v1/chat/completions", route_class="chat", model="m",
                            body={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                            estimated_tokens=tokens, settings=settings_, session_header=session, judged=True)


def peer(i, in_flight, slots):
    caps = {"engineSlots": [{"backend": "eng", "slots": slots}]} if slots else {}
    return Candidate(f"n{i}", "eng", peer=SimpleNamespace(id=f"p{i}", node_fqdn=f"n{i}", last_capabilities=caps),
                     score=in_flight + 1, in_flight=in_flight)


candidates = st.lists(st.tuples(st.integers(0, 6), st.one_of(st.none(), st.integers(1, 4)),
                                st.one_of(st.none(), st.floats(50, 5000)), st.one_of(st.none(), st.floats(100, 9000))),
                      min_size=1, max_size=6)


def setup(specs):
    book = SpeedBook()
    ranking = []
    for i, (in_flight, slots, rate, service) in enumerate(specs):
        ranking.append(peer(i, in_flight, slots))
        if rate is not None:
            book.record_read(f"n{i}", "eng", "m", 1000, 1000 * 1000 / rate)
        if service is not None:
            book.record_service(f"n{i}", "eng", "m", service)
    ranking.sort(key=lambda c: (c.score, c.node))
    return book, ranking


@settings(max_examples=150, deadline=None)
@given(candidates, st.integers(100, 20000))
def test_with_the_setting_off_the_order_is_the_specs_exactly(specs, tokens):
    book, ranking = setup(specs)
    node = make_node(book)
    with_stage = [cls(node) for cls in ALL]
    without = [cls(node) for cls in ALL if cls is not PredictedTtftStage]
    got, sections = run_stages(with_stage, list(ranking), ctx(cfg(False), tokens), [])
    spec, _ = run_stages(without, list(ranking), ctx(cfg(False), tokens), [])
    assert [c.node for c in got] == [c.node for c in spec]
    assert "ttft" not in sections


@settings(max_examples=150, deadline=None)
@given(candidates, st.integers(100, 20000))
def test_with_it_on_only_candidates_with_evidence_move_and_they_go_by_prediction(specs, tokens):
    book, ranking = setup(specs)
    stage = PredictedTtftStage(make_node(book))
    context = ctx(cfg(True), tokens)
    out, section = stage.apply(list(ranking), context)
    assert sorted(c.node for c in out) == sorted(c.node for c in ranking)
    predicted = context.scratch["ttft_predicted"]
    for before, after in zip(ranking, out, strict=True):
        if predicted[id(before)] is None:
            assert after is before  # no evidence: its queue-depth place
    ordered = [predicted[id(c)] for c in out if predicted[id(c)] is not None]
    assert ordered == sorted(ordered)
    if section is None:
        assert len(ordered) < 2


def test_the_slow_box_with_nothing_in_flight_goes_behind_the_fast_box_with_two():
    """The issue's routing log: a 1-slot box ten times slower, idle, outranked the 4-slot fast
    box with two in flight; the slow one predicted 5.4 s against 0.44 s."""
    book = SpeedBook()
    book.record_read("slow", "eng", "m", 1000, 2500)  # 400 tok/s
    book.record_read("fast", "eng", "m", 1000, 250)  # 4,000 tok/s
    book.record_service("fast", "eng", "m", 8000)
    slow = peer(0, 0, 1)
    slow.node = "slow"
    fast = peer(1, 2, 4)
    fast.node = "fast"
    context = ctx(cfg(True), 2000)
    out, section = PredictedTtftStage(make_node(book)).apply([slow, fast], context)
    assert [c.node for c in out] == ["fast", "slow"]
    by = {p["node"]: p for p in section["predictions"]}
    assert by["fast"]["predictedMs"] == 500 and by["slow"]["predictedMs"] == 5000 and section["moved"]
    # the spec's order, the setting off: the idle slow box first
    assert [c.node for c in run_stages([PredictedTtftStage(make_node(book))], [slow, fast], ctx(cfg(False)), [])[0]] \
        == ["slow", "fast"]


def test_a_full_box_waits_its_queue_and_a_cold_model_its_load():
    book = SpeedBook()
    for name in ("a", "b", "c"):
        book.record_read(name, "eng", "m", 1000, 250)
        book.record_service(name, "eng", "m", 4000)
    book.record_load("c", "eng", "m", 12_000)
    view = ResidencyView()
    view.set("c", "eng", ["other"])  # c's engine says m is not in memory
    a, b, c = peer(0, 3, 2), peer(1, 0, 2), peer(2, 0, 2)
    a.node, b.node, c.node = "a", "b", "c"
    context = ctx(cfg(True), 2000)
    out, section = PredictedTtftStage(make_node(book, view)).apply([c, a, b], context)
    by = {p["node"]: p for p in section["predictions"]}
    assert by["a"]["waitMs"] == 4000  # two ahead of its second slot: (3 - 2 + 1) * 4000 / 2
    assert by["c"]["loadMs"] == 12_000 and by["b"]["loadMs"] == 0
    assert [x.node for x in out] == ["b", "a", "c"]


def test_affinity_keeps_a_session_only_within_the_margin_of_the_best():
    book = SpeedBook()
    book.record_read("slow", "eng", "m", 1000, 2500)
    book.record_read("fast", "eng", "m", 1000, 250)
    node = make_node(book)
    ttft, affinity = PredictedTtftStage(node), PrefixAffinityStage(node)
    settings_ = cfg(True, poolPrefixAffinityMaxInFlight=2)
    slow, fast = peer(0, 0, 1), peer(1, 0, 4)
    slow.node, fast.node = "slow", "fast"
    first = ctx(settings_, 20_000, session="agent-1")
    run_stages([ttft, affinity], [slow, fast], first, [])
    for stage in (ttft, affinity):
        stage.placed(first, slow)  # the session's first turn ran on the slow box (a pin, a busy pool)
    turn = ctx(settings_, 21_000, session="agent-1")
    out, sections = run_stages([ttft, affinity], [slow, fast], turn, [])
    # the slow box holds 20k of the 21k tokens (2.5 s to read the rest) against 5.25 s cold on
    # the fast one: within the margin, the session stays
    assert out[0].node == "slow" and sections["affinity"]["outcome"] == "hit"
    longer = ctx(settings_, 60_000, session="agent-1")
    out, sections = run_stages([ttft, affinity], [slow, fast], longer, [])
    # 40k new tokens: 100 s on the slow box against 15 s cold on the fast one: affinity stands aside
    assert out[0].node == "fast" and sections["affinity"]["qualified"] is False
    assert sections["affinity"]["ttftMargin"] is True


def test_a_model_never_served_is_priced_from_the_nodes_other_models_and_its_residency():
    """The cold trace: nothing has timed the model anywhere, one node holds it in memory."""
    book = SpeedBook()
    for name in ("warm", "cold"):
        book.record_read(name, "eng", "other-model", 1000, 250)
    view = ResidencyView()
    view.set("warm", "eng", ["m"])
    view.set("cold", "eng", [])
    cold, warm = peer(0, 0, 2), peer(1, 0, 2)
    cold.node, warm.node = "cold", "warm"
    out, section = PredictedTtftStage(make_node(book, view)).apply([cold, warm], ctx(cfg(True), 2000))
    assert [c.node for c in out] == ["warm", "cold"]
    by = {p["node"]: p for p in section["predictions"]}
    assert by["cold"]["loadMs"] == 30_000 and by["warm"]["loadMs"] == 0


# -- issue 27: shared-prefix placement and spreading sessions ---------------------------------

from hubpool_core.placement.prefixes import BLOCK_BYTES, PrefixIndex, block_chain, prompt_bytes  # noqa: E402

new_settings = st.fixed_dictionaries({"poolPrefixIndex": st.integers(0, 1), "poolSessionSpread": st.integers(0, 1)})
#: what engines were sent before: (candidate index, a prompt of so many blocks sharing so many with ours)
histories = st.lists(st.tuples(st.integers(0, 5), st.integers(1, 12), st.integers(0, 12)), max_size=8)


def seeded(stage, ranking, history, tokens):
    """Fill the stage's index: candidate i was sent a prompt sharing ``same`` blocks with a
    request of ``tokens`` tokens (the request's text is ``"q" * ...``)."""
    for i, blocks, same in history:
        if i >= len(ranking):
            continue
        same = min(same, blocks)
        text = b"q" * (same * BLOCK_BYTES) + b"o" * ((blocks - same) * BLOCK_BYTES)
        stage.prefixes.remember(ranking[i].node, "eng", block_chain(text, "m"), capacity=4)


def long_ctx(settings_, tokens):
    body = {"model": "m", "messages": [{"role": "user", "content": "q" * (tokens * 4)}]}
    return PlacementContext(route="/v1/chat/completions", route_class="chat", model="m", body=body,
                            estimated_tokens=tokens, settings=settings_, judged=True)


@settings(max_examples=120, deadline=None)
@given(candidates, st.integers(100, 20000), new_settings, histories)
def test_ranking_off_is_the_specs_order_whatever_the_new_settings_and_what_was_sent(specs, tokens, new, history):
    book, ranking = setup(specs)
    node = make_node(book)
    with_stage = [cls(node) for cls in ALL]
    seeded(with_stage[0], ranking, history, tokens)
    without = [cls(node) for cls in ALL if cls is not PredictedTtftStage]
    context = long_ctx(cfg(False, **new), tokens)
    got, sections = run_stages(with_stage, list(ranking), context, [])
    spec, _ = run_stages(without, list(ranking), long_ctx(cfg(False, **new), tokens), [])
    assert [c.node for c in got] == [c.node for c in spec] and "ttft" not in sections
    assert "ttft_chain" not in context.scratch  # nothing hashed for a ranking that is off


@settings(max_examples=120, deadline=None)
@given(candidates, st.integers(100, 20000), histories)
def test_the_new_settings_off_leave_the_ranking_as_it_was(specs, tokens, history):
    book, ranking = setup(specs)
    seeded_stage = PredictedTtftStage(make_node(book))
    seeded(seeded_stage, ranking, history, tokens)
    off = dict(poolPrefixIndex=0, poolSessionSpread=0)
    got, section = seeded_stage.apply(list(ranking), long_ctx(cfg(True, **off), tokens))
    before, before_section = PredictedTtftStage(make_node(book)).apply(list(ranking), long_ctx(cfg(True), tokens))
    assert [c.node for c in got] == [c.node for c in before] and section == before_section


#: per candidate: the median round trip timed to it, wall ms (None: never timed)
hop_lists = st.lists(st.one_of(st.none(), st.floats(0, 400)), max_size=6)


@settings(max_examples=150, deadline=None)
@given(candidates, st.integers(100, 20000), histories, hop_lists, st.sampled_from([1, 10]))
def test_with_them_on_what_moves_is_by_prediction_and_ties_go_to_the_engine_holding_fewest(specs, tokens, history,
                                                                                          hops, speedup):
    book, ranking = setup(specs)
    times = HopTimes(speedup)
    for cand, hop in zip(ranking, hops, strict=False):
        if hop is not None:
            times.record(cand.peer_id, hop)
    stage = PredictedTtftStage(make_node(book, hops=times))
    seeded(stage, ranking, history, tokens)
    context = long_ctx(cfg(True, poolPrefixIndex=1, poolSessionSpread=1), tokens)
    out, section = stage.apply(list(ranking), context)
    assert sorted(c.node for c in out) == sorted(c.node for c in ranking)
    predicted = context.scratch["ttft_predicted"]
    for before, after in zip(ranking, out, strict=True):
        if predicted[id(before)] is None:
            assert after is before  # no evidence: its queue-depth place
    measured = [c for c in out if predicted[id(c)] is not None]
    if section is None:
        assert len(measured) < 2
        return
    by = {p["node"]: p for p in section["predictions"]}
    for c in measured:  # a peer's prediction carries its hop, on the engines' clock
        part = by[c.node]
        assert part["hopMs"] == round(times.engine_ms(c.peer_id))
        assert abs(part["predictedMs"] - (part["waitMs"] + part["prefillMs"] + part["loadMs"] + part["hopMs"])) <= 2
    best = min(predicted[id(c)] for c in measured)
    assert predicted[id(measured[0])] <= best + max(250, 0.1 * best)  # the first is (tied with) the best
    spread = section.get("spread")
    if tokens < SPREAD_MIN_TOKENS:
        assert spread is None  # a short prompt is not spread: the prediction decides
    tied = len(spread["tied"]) if spread else 1
    # within the tie, fewest sessions for each slot first: a 1-slot engine holding one is as full
    # as a 4-slot engine holding four
    share = [stage.prefixes.sessions(c.node, "eng") / (by[c.node]["slots"] or 1) for c in measured[:tied]]
    assert share == sorted(share)
    rest = [predicted[id(c)] for c in measured[tied:]]
    assert rest == sorted(rest)
    chain = context.scratch["ttft_chain"]
    for c in measured:  # an engine's cached tokens are what its index holds of this prompt; a full
        # one's only the head other prompts share (the slot this request gets ran another prompt)
        held = min(stage.prefixes.held_tokens(c.node, "eng", chain), tokens)
        full = by[c.node]["inFlight"] >= (by[c.node]["slots"] or 1)
        assert by[c.node]["cachedTokens"] == (min(held, stage.prefixes.shared_head(chain)) if full else held)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(0, 4)), min_size=2, max_size=6), st.integers(1024, 20000))
def test_idle_engines_of_one_speed_take_a_new_session_by_sessions_held_per_slot(boxes, tokens):
    """Boxes of one speed, idle: every prediction ties, and the engine with the smallest share of
    its slots holding sessions goes first (counted whole, the 1-slot box always won)."""
    book = SpeedBook()
    ranking = []
    for i, (slots, _) in enumerate(boxes):
        ranking.append(peer(i, 0, slots))
        book.record_read(f"n{i}", "eng", "m", 1000, 1000 * 1000 / 1500)
    stage = PredictedTtftStage(make_node(book))
    for i, (slots, held) in enumerate(boxes):
        for k in range(min(held, slots)):
            stage.prefixes.remember(f"n{i}", "eng", block_chain(f"other {i} {k} ".encode() * 400, "m"), capacity=slots)
    context = long_ctx(cfg(True, poolPrefixIndex=1, poolSessionSpread=1), tokens)
    out, section = stage.apply(list(ranking), context)
    share = {f"n{i}": min(held, slots) / slots for i, (slots, held) in enumerate(boxes)}
    assert section["spread"]["tied"] == [c.node for c in out]
    assert [share[c.node] for c in out] == sorted(share.values())
    first = min(share.values())
    assert out[0] is next(c for c in ranking if share[c.node] == first)  # then the queue-depth order


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=6 * BLOCK_BYTES), st.binary(max_size=6 * BLOCK_BYTES), st.binary(max_size=3 * BLOCK_BYTES))
def test_the_index_holds_exactly_the_whole_blocks_two_prompts_share(head, a_tail, b_tail):
    a, b = head + a_tail, head + b_tail
    index = PrefixIndex()
    index.remember("n", "eng", block_chain(a, "m"))
    shared = 0
    while shared < min(len(a), len(b)) and a[shared] == b[shared]:
        shared += 1
    whole = min(shared // BLOCK_BYTES, len(a) // BLOCK_BYTES, len(b) // BLOCK_BYTES)
    assert index.held_tokens("n", "eng", block_chain(b, "m")) == whole * BLOCK_BYTES // 4
    assert index.held_tokens("n", "eng", block_chain(b, "other")) == 0  # a cache is per model
    assert index.held_tokens("x", "eng", block_chain(b, "m")) == 0


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=6 * BLOCK_BYTES), st.binary(max_size=6 * BLOCK_BYTES), st.binary(max_size=3 * BLOCK_BYTES))
def test_a_shared_head_is_what_another_prompt_shares_not_the_sessions_own_earlier_turn(head, a_tail, b_tail):
    a, b = head + a_tail, head + b_tail
    ca, cb = block_chain(a, "m"), block_chain(b, "m")
    index = PrefixIndex()
    assert index.shared_head(cb) == 0  # nothing sent anywhere
    index.remember("n", "eng", ca)
    common = index.held_tokens("n", "eng", cb)
    # a is b's earlier turn when its every block leads b: then nothing else shares b's head
    earlier = len(ca) * BLOCK_BYTES // 4 == common
    assert index.shared_head(cb) == (0 if earlier else common)
    index.remember("other", "eng", block_chain(b"\x00" + a, "m"))  # shares no leading block with b
    assert index.shared_head(cb) == (0 if earlier else common)


def test_a_full_engine_is_priced_with_only_the_head_other_prompts_share():
    """Two peers of one speed, each holding this prompt's 4,000-token head: n0 as another session
    of the fleet (the head other prompts share), n1 as this session's own earlier turn. Free, both
    are priced holding it; full, only the fleet's head counts (the slot this request waits for ran
    another prompt)."""
    head = b"fleet system prompt and tools " * 600  # ~18 KB: 17 whole blocks
    mine = head + b"this session's own context " * 400
    ours = {"model": "m", "messages": [{"role": "user", "content": (mine + b" next turn").decode()}]}
    for in_flight, fleet_kept, own_kept in ((0, True, True), (2, True, False)):
        book = SpeedBook()
        ranking = [peer(0, in_flight, 2), peer(1, in_flight, 2)]
        for c in ranking:
            book.record_read(c.node, "eng", "m", 1000, 1000)
            book.record_service(c.node, "eng", "m", 2000)
        stage = PredictedTtftStage(make_node(book))
        stage.prefixes.remember("n0", "eng", block_chain(prompt_bytes({"messages": [
            {"role": "user", "content": (head + b"another session's task " * 200).decode()}]}), "m"), capacity=2)
        stage.prefixes.remember("n1", "eng", block_chain(prompt_bytes({"messages": [
            {"role": "user", "content": mine.decode()}]}), "m"), capacity=2)
        context = PlacementContext(route="/v1/chat/completions", route_class="chat", model="m", body=ours,
                                   estimated_tokens=len(mine) // 4, settings=cfg(True, poolPrefixIndex=1),
                                   session_header=None, judged=True)
        _, section = stage.apply(list(ranking), context)
        cached = {p["node"]: p["cachedTokens"] for p in section["predictions"]}
        head_tokens = len(head) // BLOCK_BYTES * BLOCK_BYTES // 4
        assert (cached["n0"] >= head_tokens - 256) is fleet_kept, cached
        assert (cached["n1"] > head_tokens + 1024) is own_kept, cached
        if not own_kept:
            assert cached["n1"] == cached["n0"], cached  # both keep exactly the shared head


# -- issue 27 item 4: a warm node's short queue against a cold load ----------------------------

#: per candidate: (in flight, stated slots or None, prefill tok/s or None, service ms or None, cold)
cold_candidates = st.lists(st.tuples(st.integers(0, 6), st.one_of(st.none(), st.integers(1, 4)),
                                     st.one_of(st.none(), st.floats(50, 5000)),
                                     st.one_of(st.none(), st.floats(100, 9000)), st.booleans()),
                           min_size=1, max_size=6)


def stated_setup(specs):
    """Peers stating their slots as a node states Ollama's (``ollamaSlots``), some holding the
    model in memory and some not (``resident``), with measured speeds or none."""
    book, view = SpeedBook(), ResidencyView()
    ranking = []
    for i, (in_flight, slots, rate, service, cold) in enumerate(specs):
        caps = {"ollamaSlots": slots} if slots else {}
        caps["resident"] = [{"backend": "eng", "models": [] if cold else ["m"]}]
        ranking.append(Candidate(f"n{i}", "eng", peer=SimpleNamespace(id=f"p{i}", node_fqdn=f"n{i}",
                                                                      last_capabilities=caps),
                                 score=in_flight + 1, in_flight=in_flight))
        if rate is not None:
            book.record_read(f"n{i}", "eng", "m", 1000, 1000 * 1000 / rate)
        if service is not None:
            book.record_service(f"n{i}", "eng", "m", service)
    ranking.sort(key=lambda c: (c.score, c.node))
    return book, view, ranking


@settings(max_examples=150, deadline=None)
@given(cold_candidates, st.integers(100, 20000))
def test_slot_awareness_with_the_ranking_off_is_the_specs_split_exactly(specs, tokens):
    """poolTtftRanking 0 with poolSlotAwareness 1: the pipeline is the spec's, with or without
    the predicted-TTFT stage installed (a full candidate goes behind every free one)."""
    book, view, ranking = stated_setup(specs)
    node = make_node(book, view)
    on = cfg(False, poolSlotAwareness=1)
    got, sections = run_stages([cls(node) for cls in ALL], list(ranking), ctx(on, tokens), [])
    spec, spec_sections = run_stages([cls(node) for cls in ALL if cls is not PredictedTtftStage], list(ranking),
                                     ctx(on, tokens), [])
    assert [c.node for c in got] == [c.node for c in spec]
    assert sections.get("slots") == spec_sections.get("slots") and "kept" not in (sections.get("slots") or {})


@settings(max_examples=200, deadline=None)
@given(cold_candidates, st.integers(100, 20000))
def test_with_the_ranking_on_a_full_candidate_stays_ahead_only_when_it_predicts_sooner_than_every_free_one(
        specs, tokens):
    book, view, ranking = stated_setup(specs)
    node = make_node(book, view)
    context = ctx(cfg(True, poolSlotAwareness=1), tokens)
    ttft, slots_stage = PredictedTtftStage(node), SlotsStage(node)
    ordered, _ = ttft.apply(list(ranking), context)
    out, section = slots_stage.apply(list(ordered), context)
    predicted = context.scratch["ttft_predicted"]
    slots = {id(c): c.peer.last_capabilities.get("ollamaSlots") for c in ranking}
    full = [c for c in ordered if slots[id(c)] is not None and c.in_flight >= slots[id(c)]]
    free = [c for c in ordered if slots[id(c)] is not None and c.in_flight < slots[id(c)]]
    kept = [c for c in full if predicted[id(c)] is not None and free
            and all(predicted[id(f)] is not None and predicted[id(c)] < predicted[id(f)] for f in free)]
    demoted = [c for c in full if c not in kept] if free else []
    assert sorted(c.node for c in out) == sorted(c.node for c in ranking)
    # every demoted candidate is behind every other one; the rest keep the ranking's order
    assert out == [c for c in ordered if c not in demoted] + [c for c in ordered if c in demoted]
    if section is not None:
        assert [d["node"] for d in section["demoted"]] == [c.node for c in demoted]
        assert [k["node"] for k in section.get("kept", [])] == [c.node for c in out if c in kept]
        assert all(k["predictedMs"] == predicted[id(c)] for k, c in zip(section.get("kept", []),
                                                                          [c for c in out if c in kept], strict=True))


def test_a_busy_engine_nothing_states_the_slots_of_is_priced_as_one_slot():
    """The cold trace untouched: the warm node's Ollama states no slot count; two requests in
    flight there wait two service times, against a 30 s load anywhere else."""
    book, view = SpeedBook(), ResidencyView()
    for name in ("warm", "cold"):
        book.record_read(name, "eng", "m", 1000, 500)
    book.record_service("warm", "eng", "m", 4000)
    view.set("warm", "eng", ["m"])
    view.set("cold", "eng", [])
    cold, warm = peer(0, 0, None), peer(1, 2, None)
    cold.node, warm.node = "cold", "warm"
    out, section = PredictedTtftStage(make_node(book, view)).apply([cold, warm], ctx(cfg(True), 2000))
    by = {p["node"]: p for p in section["predictions"]}
    assert by["warm"]["waitMs"] == 8000 and by["warm"]["slots"] is None
    assert by["cold"]["loadMs"] == 30_000
    assert [c.node for c in out] == ["warm", "cold"]
