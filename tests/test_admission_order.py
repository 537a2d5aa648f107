"""The admission queue's decisions as properties (issue 27 item 4; docs/placement.md, "The
admission queue"): when a request is held, and in which order a pass tries the waiters.

With ``poolTtftRanking`` 0 (nothing predicted) the queue holds a request only when every
candidate is at its known concurrency, as before; with predictions it also holds one while
waiting for a full candidate is predicted sooner than starting on every free one. With
``poolAdmissionTargetMs`` 0 a pass tries the waiters in the queue's order exactly."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from hubpool_core.api.admission import INTERACTIVE, Waiter, saturated, target_order
from hubpool_core.placement import Candidate, PlacementContext
from hubpool_core.placement.plan import PlacementRequest, Plan
from hubpool_core.placement.speed import SCRATCH_PREDICTED, SCRATCH_SLOT_MS

ENGINE = SimpleNamespace(kind="eng", states_slots=True)
#: per candidate: (in flight, stated slots or None, predicted ms or None, ms one more queued request adds)
specs = st.lists(st.tuples(st.integers(0, 5), st.one_of(st.none(), st.integers(1, 4)),
                           st.one_of(st.none(), st.integers(0, 60_000)), st.integers(1, 20_000)),
                 min_size=1, max_size=5)


def plan_of(items, predicted: bool) -> Plan:
    candidates = []
    for i, (in_flight, slots, _, _) in enumerate(items):
        caps = {"ollamaSlots": slots} if slots else {}
        candidates.append(Candidate(f"n{i}", "eng", peer=SimpleNamespace(id=f"p{i}", last_capabilities=caps),
                                    score=in_flight + 1, in_flight=in_flight))
    context = PlacementContext(route="/v1/chat/completions", route_class="chat", model="m", body={},
                               estimated_tokens=100, settings=None, judged=True)
    if predicted:
        context.scratch[SCRATCH_PREDICTED] = {id(c): item[2] for c, item in zip(candidates, items, strict=True)}
        context.scratch[SCRATCH_SLOT_MS] = {id(c): float(item[3]) for c, item in zip(candidates, items, strict=True)}
    return Plan("m", {}, b"", 100, 60_000, candidates, {}, context)


def full(item) -> bool:
    return item[1] is not None and item[0] >= item[1]


SETTINGS = SimpleNamespace(ollamaSlots=None)


@settings(max_examples=300, deadline=None)
@given(specs, st.integers(0, 5))
def test_without_predictions_a_request_waits_only_when_every_slot_is_taken(items, ahead):
    plan = plan_of(items, predicted=False)
    assert saturated(plan, SETTINGS, {"eng": ENGINE}, ahead) == all(full(i) for i in items)


@settings(max_examples=300, deadline=None)
@given(specs, st.integers(0, 5))
def test_with_predictions_it_also_waits_for_a_full_candidate_predicted_sooner_than_every_free_one(items, ahead):
    plan = plan_of(items, predicted=True)
    free = [i for i in items if not full(i)]
    waits = [i[2] + ahead * i[3] for i in items if full(i) and i[2] is not None]
    sooner = bool(free) and all(i[2] is not None for i in free) and bool(waits) \
        and min(waits) < min(i[2] for i in free)
    assert saturated(plan, SETTINGS, {"eng": ENGINE}, ahead) == (not free or sooner)


NOW = 1000.0


def waiter(seq: int, klass: int, key: str, waited_ms: int) -> Waiter:
    request = PlacementRequest("/v1/chat/completions", "openai", "chat", "m", {}, b"", False)
    return Waiter(request, key, klass, seq, enqueued=NOW - waited_ms / 1000, ready=None)  # type: ignore[arg-type]


def frozen():
    """The queue's clock held still, so a wait cannot cross the target between two reads."""
    return mock.patch("hubpool_core.api.admission.time.monotonic", return_value=NOW)


queues = st.lists(st.tuples(st.integers(0, 1), st.sampled_from(["a", "b", "c"]), st.integers(0, 20_000)),
                  max_size=10)


@settings(max_examples=300, deadline=None)
@given(queues, st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 5)))
def test_with_no_target_a_pass_tries_the_waiters_in_the_queues_order(items, served):
    waiters = [waiter(i, klass, key, ms) for i, (klass, key, ms) in enumerate(items)]
    order = sorted(waiters, key=lambda w: (w.klass, served.get(w.key, 0), w.seq))
    first, late = target_order(order, served, 0)
    assert first == order and late == []


@settings(max_examples=300, deadline=None)
@given(queues, st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 5)),
       st.integers(1, 20_000), st.integers(1, 10))
def test_with_a_target_those_that_can_still_make_it_go_first_newest_first(items, served, target, speedup):
    waiters = [waiter(i, klass, key, ms) for i, (klass, key, ms) in enumerate(items)]
    order = sorted(waiters, key=lambda w: (w.klass, served.get(w.key, 0), w.seq))
    with frozen():
        first, late = target_order(order, served, target, speedup)
        late_expected = [w for w in order if w.waited_ms() * speedup >= target]
        first_waits = [w.waited_ms() * speedup for w in first]
    # nobody lost or doubled
    assert sorted(w.seq for w in first + late) == sorted(w.seq for w in order)
    # past the target (on the engines' clock) is late, in the queue's order
    assert late == late_expected
    assert all(ms < target for ms in first_waits)
    # interactive before batch and the least-served key first still hold; within them, newest first
    keys = [(w.klass, served.get(w.key, 0), -w.seq) for w in first]
    assert keys == sorted(keys)
    assert all(w.klass == INTERACTIVE for w in first[:1]) or all(w.klass != INTERACTIVE for w in first)
