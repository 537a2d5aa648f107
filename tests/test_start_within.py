"""A forward that must start soon or not at all (hubpool_core/proxy/start_within.py): what the
entry node allows each peer, and how a leaf reads the header. The three-node test of the
mechanism is in tests/test_placement_mechanisms.py."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from hubpool_core.placement.slot_clock import MAX_FREE_MS, SlotClock
from hubpool_core.placement.speed import SCRATCH_PREDICTED, SCRATCH_WAIT
from hubpool_core.proxy.start_within import HEADER, allowances, asked, wait_here


def ranked(specs):
    """Candidates and a context whose scratch holds (is_local, predicted, wait) for each."""
    cands = [SimpleNamespace(is_local=local) for local, _, _ in specs]
    scratch = {SCRATCH_PREDICTED: {id(c): p for c, (_, p, _) in zip(cands, specs, strict=True)},
               SCRATCH_WAIT: {id(c): w for c, (_, _, w) in zip(cands, specs, strict=True)}}
    return cands, SimpleNamespace(scratch=scratch)


def test_a_peer_may_wait_its_predicted_wait_plus_its_lead_over_the_next():
    cands, context = ranked([(False, 1_000, 0), (False, 4_000, 2_500), (True, 3_000, 0), (False, 9_000, 0)])
    # the first leads the best later prediction (3 s, the local engine) by 2 s; the second trails
    # it and may wait only what it was predicted to; the local engine and the last get nothing
    assert allowances(context, cands) == {0: 2_000, 1: 2_500}


def test_nothing_is_allowed_without_predictions():
    cands = [SimpleNamespace(is_local=False), SimpleNamespace(is_local=False)]
    assert allowances(SimpleNamespace(scratch={}), cands) == {}
    assert allowances(None, cands) == {}


specs = st.lists(st.tuples(st.booleans(), st.one_of(st.none(), st.floats(0, 1e6)), st.floats(0, 1e6)),
                 max_size=8)


@given(specs)
def test_only_peers_before_the_last_with_a_predicted_alternative_are_asked_and_never_below_their_wait(specs):
    cands, context = ranked(specs)
    got = allowances(context, cands)
    for i, allowed in got.items():
        local, mine, wait = specs[i]
        later = [p for _, p, _ in specs[i + 1:] if p is not None]
        assert i < len(specs) - 1 and not local and mine is not None and later
        assert allowed == min(MAX_FREE_MS, round(wait + max(0.0, min(later) - mine)))
        assert allowed >= min(MAX_FREE_MS, round(wait))
    for i, (local, mine, _) in enumerate(specs[:-1]):
        if not local and mine is not None and any(p is not None for _, p, _ in specs[i + 1:]):
            assert i in got


@given(st.text(max_size=12))
def test_the_header_is_whole_milliseconds_up_to_an_hour_or_ignored(value):
    got = asked({HEADER: value})
    stripped = value.strip()
    if got is None:
        assert not (stripped.isdigit() and stripped.isascii() and len(stripped) <= 7
                    and int(stripped) <= MAX_FREE_MS)
    else:
        assert 0 <= got <= MAX_FREE_MS and got == int(stripped)
    assert asked({}) is None


def test_a_leaf_waits_for_its_soonest_slot_and_cannot_say_without_slots_or_plans():
    clock = SlotClock(lambda: 100.0)
    assert wait_here(clock, "llamacpp", 2) == 0.0
    clock.start("llamacpp", 5_000, 4_000)
    clock.start("llamacpp", 9_000, 8_000)
    assert wait_here(clock, "llamacpp", 2) == 5_000 and wait_here(clock, "llamacpp", 3) == 0.0
    assert wait_here(clock, "llamacpp", None) is None
    clock.start("llamacpp", None, None)
    assert wait_here(clock, "llamacpp", 2) is None
