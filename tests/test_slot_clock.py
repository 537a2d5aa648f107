"""The slot clock (hubpool_core/placement/slot_clock.py): when each engine's slots free, played
forward from the work in flight, and a peer's stated schedule read back aged. The three-node test
of the mechanism is in tests/test_placement_mechanisms.py."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from hubpool_core.placement.slot_clock import (
    ANSWER_PLAN_TOKENS,
    MAX_FREE_MS,
    MAX_SLOTS,
    OVERRUN,
    PeerSlots,
    SlotClock,
    asked_answer_tokens,
    parse_free,
    planned_answer_ms,
    planned_work,
    stated_ms,
    with_more,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_running_requests_hold_the_slots_and_a_queued_one_takes_the_first_to_free():
    t = Clock()
    clock = SlotClock(t)
    clock.start("llamacpp", 10_000, 8_000)
    t.now += 2
    clock.start("llamacpp", 4_000, 3_000)
    t.now += 1
    queued = clock.start("llamacpp", 5_000, 4_000)
    # the first has 7 s left, the second 3 s; the third waits for the second and holds 5 s
    assert clock.free_in("llamacpp", 2) == [7_000, 8_000]
    assert clock.total() == 3 and clock.free_in("ollama", 2) == [0.0, 0.0]
    clock.finish(queued)
    assert clock.free_in("llamacpp", 2) == [3_000, 7_000]
    assert clock.free_in("llamacpp", 3) == [0.0, 3_000, 7_000]


def test_after_the_first_token_only_the_answer_is_left():
    t = Clock()
    clock = SlotClock(t)
    entry = clock.start("llamacpp", 10_000, 2_000)  # an 8 s prefill, then 2 s of answer
    t.now += 1
    entry.first_token()  # the prompt was cached: it read in 1 s
    t.now += 0.5
    assert clock.free_in("llamacpp", 1) == [1_500]


def test_a_request_past_its_plan_is_priced_at_the_mean_service_time():
    t = Clock()
    clock = SlotClock(t)
    clock.start("llamacpp", 1_000, 500, mean_ms=6_000)
    clock.start("vllm", 1_000, 500)
    t.now += 3
    assert clock.free_in("llamacpp", 1) == [6_000]
    assert clock.free_in("vllm", 1) == [OVERRUN * 1_000]


def test_an_unknown_length_makes_the_schedule_unknown():
    clock = SlotClock(Clock())
    clock.start("llamacpp", None, None)
    assert clock.free_in("llamacpp", 1) is None and clock.header_value("llamacpp", 1) is None
    # an engine reporting no timings has a mean service time and no plan: its count prices the
    # wait ((in flight - slots + 1) x mean / slots), not a schedule of whole mean services
    clock.start("vllm", None, None, mean_ms=4_000)
    assert clock.free_in("vllm", 2) is None
    clock.start("ollama", 1_000, 500, mean_ms=4_000)
    clock.start("ollama", None, None, mean_ms=4_000)  # queued behind, length unknown
    assert clock.free_in("ollama", 1) is None


def test_the_asked_answer_is_read_in_every_dialect():
    assert asked_answer_tokens({"max_tokens": 200}) == 200
    assert asked_answer_tokens({"max_completion_tokens": 90}) == 90
    assert asked_answer_tokens({"max_output_tokens": 70}) == 70
    assert asked_answer_tokens({"options": {"num_predict": 60}}) == 60
    # OpenAI's newer key wins, as the engines and the proxy's resume read it
    assert asked_answer_tokens({"max_tokens": 200, "max_completion_tokens": 90}) == 90
    for body in ({}, {"max_tokens": 0}, {"max_tokens": True}, {"max_tokens": "9"}, [], None, {"options": 3}):
        assert asked_answer_tokens(body) is None


def test_an_agents_ceiling_is_not_its_plan():
    speed = SimpleNamespace(decode_ms_per_token=20.0, answer_tokens=150.0)
    assert planned_answer_ms(speed, 250) == 250 * 20.0  # a chat app's own length
    assert planned_answer_ms(speed, 32_000) == 150 * 20.0  # Claude Code's ceiling: the typical answer
    assert planned_answer_ms(speed, ANSWER_PLAN_TOKENS) == ANSWER_PLAN_TOKENS * 20.0
    assert planned_answer_ms(speed, None) == 150 * 20.0
    assert planned_answer_ms(SimpleNamespace(decode_ms_per_token=None, answer_tokens=None), 100) is None
    full = SimpleNamespace(decode_ms_per_token=20.0, answer_tokens=150.0, prefill_tps=2_000.0, service_ms=9_000.0)
    assert planned_work(full, 4_000, None, {"max_tokens": 100}) == (2_000 + 2_000, 2_000)
    assert planned_work(full, 4_000, 300.0, {"max_tokens": 100}) == (300 + 2_000, 2_000)  # a cached prefix
    assert planned_work(None, 4_000, None, {}) == (None, None)


def test_a_peers_schedule_is_validated_and_aged():
    t = Clock()
    book = PeerSlots(t)
    book.note_capabilities("p1", {"inFlightRequests": 3, "slotsFree": [{"backend": "llamacpp", "ms": [900, 4000]}]})
    t.now += 0.5
    assert book.stated("p1", "llamacpp") == ([400.0, 3_500.0], 3)
    t.now += 1
    assert book.stated("p1", "llamacpp") == ([0.0, 2_500.0], 3)
    # its first slot's request has overrun what was stated (the count has not fallen): it is priced
    # at the mean service time the caller names, not as a free slot
    assert book.stated("p1", "llamacpp", 6_000.0) == ([6_000.0, 2_500.0], 3)
    book.note("p3", "llamacpp", [0.0, 800.0], 1)
    t.now += 2
    assert book.stated("p3", "llamacpp", 6_000.0) == ([0.0, 6_000.0], 1)  # stated free stays free
    for bad in ([-1], [float("nan")], ["12x"], ["\u00b2"], [True], [4_000_000], []):
        assert parse_free(bad) is None
    assert parse_free(["12", " 40"]) == [12.0, 40.0]
    assert len(parse_free(range(100)) or []) == MAX_SLOTS
    book.note_capabilities("p2", {"inFlightRequests": "3", "slotsFree": [{"backend": "llamacpp", "ms": [1]}]})
    book.note_capabilities("p2", {"inFlightRequests": 1, "slotsFree": [{"backend": "llamacpp", "ms": ["x"]}]})
    assert book.stated("p2", "llamacpp") is None
    book.forget("p1")
    assert book.stated("p1", "llamacpp") is None


plans = st.lists(st.tuples(st.floats(0, 100_000), st.floats(0, 100_000), st.floats(0, 30)), max_size=12)


@given(plans, st.integers(1, 8))
def test_every_slot_has_a_time_and_more_work_never_frees_a_slot_sooner(work, slots):
    t = Clock()
    clock = SlotClock(t)
    before = clock.free_in("llamacpp", slots)
    for planned, answer, gap in work:
        clock.start("llamacpp", planned, min(answer, planned))
        t.now += gap / 10
        before = clock.free_in("llamacpp", slots)
        assert before is not None and len(before) == slots and before == sorted(before)
        assert all(v >= 0 for v in before)
    clock.start("llamacpp", 1_000, 500)
    after = clock.free_in("llamacpp", slots)
    assert after is not None and all(x >= y for x, y in zip(after, before or [], strict=True))


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=16), st.integers(0, 20), st.floats(1, 1e5))
def test_each_request_queued_ahead_adds_to_the_wait(free, more, service):
    wait = with_more(free, more, service)
    assert wait is not None and wait >= min(free)
    assert with_more(free, more + 1, service) >= wait  # type: ignore[operator]
    assert with_more(free, 0, None) == min(free)


def test_a_slot_about_to_free_is_not_told_to_a_peer_as_free():
    """A peer reads a stated 0 as a free slot until its count falls; rounded, a request 0.3 ms from
    its plan's end made a full engine read as free for good (a flaky three-node test found it)."""
    t = Clock()
    clock = SlotClock(t)
    clock.start("llamacpp", 1_000, 500)
    t.now += 0.9997
    assert clock.header_value("llamacpp", 2) == "0,1"  # one slot free, one busy for 0.3 ms more
    book = PeerSlots(t)
    book.note("p1", "llamacpp", parse_free(clock.header_value("llamacpp", 2).split(",")), 1)
    t.now += 0.0011  # past what was stated: priced as overrunning, not as free
    assert book.stated("p1", "llamacpp", 6_000.0) == ([0.0, 6_000.0], 1)


@given(st.lists(st.floats(0, 1e8), max_size=80))
def test_what_a_peer_is_told_is_free_only_where_free_and_always_accepted(free):
    told = stated_ms(free)
    assert [v == 0 for v in told] == [v == 0 for v in free[:MAX_SLOTS]]
    assert all(v <= MAX_FREE_MS for v in told)
    assert parse_free(told) == ([float(v) for v in told] or None)


def test_nothing_said_prices_nothing():
    assert with_more([], 0, 10.0) is None
    assert with_more([5.0], 2, None) is None
