"""F9: the withholding clock (hubpool_core/placement/quarantine.py) and the unreachable and refusal clocks
(hubpool_core/peering/health.py) under a frozen clock, to the second.

Withholding: two faults less than 300 s apart withhold (node, engine, model) for 60 s; a fault
on the re-probe after that doubles it, to at most 900 s; dropped connections under 1 s apart
are one event; a clean answer clears it. Unreachable: three failed polls, never backed off;
refusals back off from two polls, doubling, to at most 15 minutes. Every boundary is tested on
both sides with the clock stopped there."""

from __future__ import annotations

import pytest
from harness import fqdn, make_pool, pair

from hubpool_core.peering import health
from hubpool_core.placement.quarantine import BASE_WITHHOLD_S, DROPPED, MAX_WITHHOLD_S, STRIKE_WINDOW_S, Quarantine

KEY = ("local", "ollama", "llama3.2:3b")
EPS = 0.001


class FrozenClock:
    """A clock that moves only when told to."""

    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def time(self) -> float:  # stands in for the time module in hubpool_core.peering.health
        return self.t

    def monotonic(self) -> float:
        return self.t


def test_f9_two_faults_within_the_window_withhold_for_exactly_60s():
    clock = FrozenClock()
    q = Quarantine(clock)
    assert q.strike(KEY, "truncated") is False and not q.withheld(KEY)
    clock.t += STRIKE_WINDOW_S - EPS  # 299.999 s later: still inside the window
    assert q.strike(KEY, "truncated") is True
    start = clock.t
    clock.t = start + BASE_WITHHOLD_S - EPS
    assert q.withheld(KEY) and q.withheld_models("local", "ollama") == {KEY[2]}
    assert q.snapshot()[0]["withheldForMs"] == 1
    clock.t = start + BASE_WITHHOLD_S
    assert not q.withheld(KEY) and q.snapshot() == []


def test_f9_faults_300s_apart_do_not_withhold():
    clock = FrozenClock()
    q = Quarantine(clock)
    q.strike(KEY, "truncated")
    clock.t += STRIKE_WINDOW_S  # exactly 300 s: the first strike has left the window
    assert q.strike(KEY, "truncated") is False and not q.withheld(KEY)
    clock.t += STRIKE_WINDOW_S - EPS
    assert q.strike(KEY, "truncated") is True


def test_f9_each_failed_reprobe_doubles_the_withhold_up_to_15_minutes():
    clock = FrozenClock()
    q = Quarantine(clock)
    q.strike(KEY, "truncated")
    assert q.strike(KEY, "truncated")
    lengths = []
    for _ in range(7):
        start = clock.t
        # a strike while withheld changes nothing
        clock.t = start + 1
        assert q.strike(KEY, "truncated") is False
        # find the end of this withhold to the millisecond
        length = next(s for s in range(1, 2000) if not _withheld_at(q, clock, start + s))
        assert _withheld_at(q, clock, start + length - EPS) and not _withheld_at(q, clock, start + length)
        lengths.append(length)
        clock.t = start + length
        assert q.strike(KEY, "re-probe failed") is True  # the re-probe's fault withholds at once
    assert lengths == [60, 120, 240, 480, 900, 900, 900], lengths
    assert MAX_WITHHOLD_S == 900
    assert q.clear(KEY) and not q.withheld(KEY)
    # after a clean answer it takes two faults again, and starts from 60 s
    assert q.strike(KEY, "truncated") is False
    assert q.strike(KEY, "truncated") is True
    start = clock.t
    assert _withheld_at(q, clock, start + 60 - EPS) and not _withheld_at(q, clock, start + 60)


def _withheld_at(q: Quarantine, clock: FrozenClock, t: float) -> bool:
    saved, clock.t = clock.t, t
    try:
        return q.withheld(KEY)
    finally:
        clock.t = saved


def test_f9_dropped_connections_within_one_second_are_one_event():
    clock = FrozenClock()
    q = Quarantine(clock)
    reason = f"{DROPPED} (ECONNRESET)"
    assert q.strike(KEY, reason) is False
    clock.t += 1.0 - EPS
    assert q.strike(KEY, reason) is False and not q.withheld(KEY)  # the same death, counted once
    clock.t += EPS  # 1.0 s after the first (counted) drop: a second event
    assert q.strike(KEY, reason) is True


@pytest.fixture
def pair_ab(tmp_path):
    nodes = make_pool(tmp_path, ["hub-a", "hub-b"])
    a, b = nodes["hub-a"].start(), nodes["hub-b"].start()
    try:
        pair(a, b)
        a.run(a.node.health.stop())  # the test drives every poll itself, at frozen times
        yield a, b
    finally:
        a.stop()
        b.stop()


def _poll(a, clock: FrozenClock, t: float):
    clock.t = t
    row = next(r for r in a.node.peers.all() if r.node_fqdn == fqdn("hub-b"))
    a.run(a.node.health.probe(row))
    row = a.node.peers.by_id(row.id)
    return row, a.node.health.failures.get(row.id)


def test_f9_unreachable_after_exactly_three_polls_and_no_backoff(pair_ab, monkeypatch):
    a, b = pair_ab
    clock = FrozenClock(1_800_000_000.0)
    monkeypatch.setattr(health, "time", clock)
    row, failure = _poll(a, clock, clock.t)
    assert row.status == "connected" and failure is None
    b.stop()  # nothing listens at hub-b's address now
    t0 = clock.t + 30
    seen = []
    for i in range(4):
        row, failure = _poll(a, clock, t0 + 30 * i)
        seen.append((row.status, row.consecutive_failures, failure.kind, failure.attempts, failure.since,
                     failure.last_attempt_at, failure.next_probe_at))
    assert [s[:4] for s in seen] == [("connected", 1, "unreachable", 1), ("connected", 2, "unreachable", 2),
                                     ("unreachable", 3, "unreachable", 3), ("unreachable", 4, "unreachable", 4)]
    assert all(s[4] == t0 for s in seen), "since is the first failure, to the second"
    assert [s[5] for s in seen] == [t0 + 30 * i for i in range(4)]
    assert all(s[6] is None for s in seen), "an unreachable peer is polled every tick, never backed off"
    body = failure.as_json()
    assert body["since"].startswith("2027-01-15T08:00:30") and body["nextProbeAt"] is None


def test_f9_refusals_back_off_from_two_polls_doubling_to_15_minutes(pair_ab, monkeypatch):
    a, b = pair_ab
    clock = FrozenClock(1_800_000_000.0)
    monkeypatch.setattr(health, "time", clock)
    # hub-b forgets hub-a (its database lost the row): every signed call from hub-a is refused 401
    b_row = next(r for r in b.node.peers.all() if r.node_fqdn == fqdn("hub-a"))
    assert b.node.peers.delete(b_row.id)
    poll_s = a.node.health.poll_s
    assert poll_s == 30
    t = clock.t
    gaps = []
    for attempt in range(1, 9):
        row, failure = _poll(a, clock, t)
        assert failure.kind == "unauthorized" and failure.attempts == attempt, (attempt, failure)
        gap = failure.next_probe_at - t
        gaps.append(gap)
        # one second before it is due, a tick does not probe (attempts unchanged) ...
        _, held = _poll(a, clock, failure.next_probe_at - 1)
        assert held.attempts == attempt and held.last_attempt_at == t
        t = failure.next_probe_at  # ... and on the second it is due, it does
    assert gaps == [min(900, poll_s * 2 ** n) for n in range(1, 9)], gaps
    assert gaps[:5] == [60, 120, 240, 480, 900] and gaps[-1] == 900
