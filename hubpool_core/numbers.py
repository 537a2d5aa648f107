"""Whole numbers read from text another party wrote (a header, a peer's schedule)."""

from __future__ import annotations


def whole_number(text: str, max_digits: int) -> int | None:
    """``text`` as a non-negative whole number of at most ``max_digits`` ASCII digits, else None.
    ``str.isdigit`` alone admits '²' and other digits ``int`` refuses: one in a peer's header
    raised in the relay."""
    text = text.strip()
    if not text or len(text) > max_digits or not text.isascii() or not text.isdigit():
        return None
    return int(text)
