"""Whole numbers read from another party's text (hubpool_core/numbers.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hubpool_core.numbers import whole_number


def test_only_ascii_digits_are_a_number():
    assert whole_number(" 42 ", 3) == 42
    for bad in ("²", "٣", "4²", "-1", "+1", "1.0", "", "1234"):
        assert whole_number(bad, 3) is None, bad


@given(st.text(max_size=10), st.integers(1, 8))
def test_a_number_is_returned_exactly_when_int_would_read_its_ascii_digits(text, digits):
    got = whole_number(text, digits)
    s = text.strip()
    if s and s.isascii() and s.isdigit() and len(s) <= digits:
        assert got == int(s)
    else:
        assert got is None
