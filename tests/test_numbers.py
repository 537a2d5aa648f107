"""Whole numbers a peer or a stranger writes (an in-flight count, a slot schedule, the start-within
header, Content-Length) go through the core's one strict parser, ``whole_in_range``: ASCII digits
only, never an exception (``str.isdigit`` admits '²', which ``int`` refuses: one in a peer's header
raised in the relay)."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from hubpool_core.config import whole_in_range


def test_only_ascii_digits_are_a_number():
    assert whole_in_range(" 42 ", 0, 999) == 42
    for bad in ("²", "٣", "4²", "-1", "+1", "1.0", "", "1234"):
        assert whole_in_range(bad, 0, 999) is None, bad


@given(st.text(max_size=10), st.integers(1, 8))
def test_a_number_is_returned_exactly_when_int_would_read_its_ascii_digits(text, digits):
    top = 10 ** digits - 1
    got = whole_in_range(text, 0, top)
    s = text.strip()
    if re.fullmatch(r"-?[0-9]{1,18}", s) and 0 <= int(s) <= top:
        assert got == int(s)
    else:
        assert got is None
