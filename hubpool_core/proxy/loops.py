"""The loop rule (issue 28 item 3): a stream whose generated text ends in one span repeated
back to back, over at least ``LOOP_MIN_CHARS`` characters and at least ``LOOP_MIN_REPEATS``
times, is a degenerate loop (``degenerate-loop``), and its attempt is ended.

Why this shape. A small quantised model stuck in a loop streams the same sentence (or the
same few tokens) again and again, exactly: greedy decoding from the same state takes the
same path. Ordinary text repeats too — a code block's closing braces, a table's separator
row, a list's bullets — but in spans that are short and few, or that differ somewhere (a
number, a name). A run of 600 characters that is one span four or more times over is
neither. The rule's false-positive rate on ordinary text, and what it catches in real
engines' degenerate outputs, are measured in ``tests/test_loop_rule.py`` and written in
docs/reliability.md. The text is the stream's JSON strings as sent (escapes kept), the last
``WINDOW`` bytes of it, checked every ``CHECK_EVERY`` new bytes: a handful of ``rfind`` and
slice comparisons, never a parse.
"""

from __future__ import annotations

#: the repeated run must be at least this long (bytes of generated text) ...
LOOP_MIN_CHARS = 600
#: ... and hold its span at least this many times
LOOP_MIN_REPEATS = 4
#: the longest span looked for (a loop of whole paragraphs still fits the window 4 times)
LOOP_MAX_SPAN = 2000
WINDOW = 8192
CHECK_EVERY = 256
#: the tail looked for earlier in the text to find candidate spans, and how many tried
_KEY = 32
_CANDIDATES = 4


def _common_suffix(text: bytes, span: int) -> int:
    """How long the end of ``text`` equals the text ``span`` bytes before it (bisection on
    slices: comparisons in C)."""
    n = len(text)
    low, high = 0, n - span
    while low < high:
        mid = (low + high + 1) // 2
        if text[n - mid:] == text[n - span - mid:n - span]:
            low = mid
        else:
            high = mid - 1
    return low


def repeated_tail(text: bytes) -> tuple[int, int]:
    """(span, run): the span whose back-to-back repetition ends ``text`` over the longest run
    (run counts the first copy too), among the nearest few earlier occurrences of the tail;
    (0, 0) when there is none."""
    n = len(text)
    key_len = min(_KEY, n // 2)
    if key_len == 0:
        return 0, 0
    key = text[n - key_len:]
    lowest = max(0, n - key_len - LOOP_MAX_SPAN)
    end = n - 1  # an occurrence that ends before the tail itself does
    best = (0, 0)
    for _ in range(_CANDIDATES):
        at = text.rfind(key, lowest, end)
        if at < 0:
            break
        span = n - key_len - at
        run = _common_suffix(text, span) + span
        if run > best[1]:
            best = (span, run)
        end = at + key_len - 1
    return best


def is_loop(span: int, run: int) -> bool:
    return span > 0 and run >= max(LOOP_MIN_CHARS, LOOP_MIN_REPEATS * span)


class LoopGuard:
    """Fed a stream's generated text as it passes; ``found`` is (span, run) once it loops."""

    __slots__ = ("text", "unchecked", "found")

    def __init__(self) -> None:
        self.text = bytearray()
        self.unchecked = 0
        self.found: tuple[int, int] | None = None

    def add(self, text: bytes) -> bool:
        """True when the text so far now ends in a loop."""
        if not text:
            return False
        self.text += text
        self.unchecked += len(text)
        if self.unchecked < CHECK_EVERY:
            return False
        self.unchecked = 0
        if len(self.text) > 2 * WINDOW:
            del self.text[:-WINDOW]
        span, run = repeated_tail(bytes(self.text[-WINDOW:]))
        if is_loop(span, run):
            self.found = (span, run)
            return True
        return False

    def reason(self) -> str:
        span, run = self.found or (0, 0)
        return f"a {span}-character span repeated {run // max(span, 1)} times"
