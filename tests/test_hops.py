"""The hop a peer costs (hubpool_core/placement/hops.py): the median of the last eight answered
round trips, nothing else kept, nothing from a stall or a non-number, scaled onto the engines'
clock only for predictions."""

from __future__ import annotations

import math
import statistics

from hypothesis import given
from hypothesis import strategies as st

from hubpool_core.placement.hops import MAX_MS, WINDOW, HopTimes

readings = st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(0, 500)), max_size=40)


@given(readings, st.integers(1, 100))
def test_the_hop_is_the_median_of_the_last_eight_answers_that_are_hops(values, speedup):
    hops = HopTimes(speedup)
    for v in values:
        hops.record("p", v)
    kept = [v for v in values if math.isfinite(v) and 0 <= v <= MAX_MS][-WINDOW:]
    assert hops.readings("p") == len(kept)
    if kept:
        assert hops.wall_ms("p") == statistics.median(kept)
        assert math.isclose(hops.engine_ms("p"), statistics.median(kept) * speedup)
    else:
        assert hops.wall_ms("p") is None and hops.engine_ms("p") == 0.0
    assert hops.engine_ms(None) == 0.0 and hops.engine_ms("never timed") == 0.0  # local, or unknown
