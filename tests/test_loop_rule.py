"""The loop rule (issue 28 item 3, hubpool_core/proxy/loops.py) measured: what it catches in a
real engine's degenerate outputs, and how often it fires on ordinary text — code, tables,
lists — which repeats legitimately. The figures are written in docs/reliability.md.

Text goes through the guard as a stream carries it: JSON-escaped, a few bytes a chunk.
"""

from __future__ import annotations

import glob
import json
import sysconfig
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from hubpool_core.proxy.loops import LOOP_MIN_CHARS, LoopGuard, is_loop, repeated_tail

ROOT = Path(__file__).resolve().parent.parent
#: a real llama-server (scripts/build_llama_server.py) on the real-engine tests' tiny model,
#: asked ten questions at temperature 0 (greedy) and 0.8, 1,500 tokens at most (the
#: generator is in the docs); random weights degenerate the way small models do
TINY_OUTPUTS = ROOT / "tests" / "data" / "tiny_llama_outputs.json"


def first_loop(text: str, step: int = 4) -> int | None:
    """Where in the escaped stream the guard fires, or None."""
    guard = LoopGuard()
    raw = json.dumps(text)[1:-1].encode()
    for i in range(0, len(raw), step):
        if guard.add(raw[i:i + step]):
            return i
    return None


def test_a_small_models_sentence_loop_is_caught_early():
    sentence = " The answer is the same as the answer."
    at = first_loop("Let me think about this." + sentence * 200)
    assert at is not None and at < LOOP_MIN_CHARS + 4 * len(sentence) + 300


def test_real_greedy_degenerate_outputs():
    outputs = json.loads(TINY_OUTPUTS.read_text())
    greedy = [o for o in outputs if o["temperature"] == 0.0 and len(json.dumps(o["text"])) > 4000]
    caught = [o for o in greedy if first_loop(o["text"]) is not None]
    sampled = [o for o in outputs if o["temperature"] > 0 and first_loop(o["text"]) is not None]
    print(f"greedy outputs run to their limit: {len(greedy)}, caught {len(caught)}; sampled ones caught: "
          f"{len(sampled)} of {sum(o['temperature'] > 0 for o in outputs)}")
    assert len(greedy) == 6 and len(caught) >= 5
    assert not sampled  # byte soup that never repeats is not a loop


def test_false_positives_on_ordinary_text():
    """Every module of the Python standard library (code, docstrings, tables of data) and
    every page of this repository's docs (prose, tables, lists, shell blocks)."""
    stdlib = sysconfig.get_paths()["stdlib"]
    code = [f for f in sorted(glob.glob(stdlib + "/**/*.py", recursive=True)) if "site-packages" not in f]
    docs = sorted(glob.glob(str(ROOT / "docs" / "*.md"))) + [str(ROOT / "README.md")]
    fired = {}
    chars = 0
    for path in code + docs:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        chars += len(text)
        if first_loop(text) is not None:
            fired[path] = True
    rate = len(fired) / len(code + docs)
    print(f"{len(code)} modules and {len(docs)} pages, {chars:,} characters: fired on {len(fired)} "
          f"({rate:.3%}): {sorted(Path(p).name for p in fired)}")
    assert len(code) > 1000
    assert rate < 0.002  # measured: 1 of 1,790 modules (test_email.py's MIME header table)
    assert not [p for p in fired if p in docs]


@given(st.text(min_size=1, max_size=40), st.integers(min_value=1, max_value=40))
def test_repeated_tail_finds_the_repetition(span_text, repeats):
    unit = span_text.encode()
    text = b"x" * 7 + unit * repeats
    span, run = repeated_tail(text)
    if repeats >= 2 and len(unit) >= 1:
        assert run >= len(unit) * repeats or span < len(unit)  # the unit, or a smaller period within it
    assert is_loop(span, run) == (span > 0 and run >= max(LOOP_MIN_CHARS, 4 * span))
