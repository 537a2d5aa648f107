"""StreamJudge stops parsing frames once the head cannot be degenerate (docs/performance.md,
step 8). Its verdicts must be those of judging that parses every frame while the head is
short: the reference below is that judge (the previous `feed`), and hypothesis streams mix
text, placeholders, whitespace, error frames, [DONE], final frames and chunk boundaries."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hubpool_core.engine import NATIVE, OPENAI, Engine
from hubpool_core.proxy import output_check
from hubpool_core.proxy.output_check import HEAD_CHARS, StreamJudge, _text_of


def _final(dialect: str, frame: bytes) -> bool:
    return Engine.is_final_frame(None, dialect, frame)  # type: ignore[arg-type]


class ParseEveryFrame(StreamJudge):
    """The reference: every frame parsed while fewer than HEAD_CHARS characters are collected."""

    def feed(self, chunk: bytes) -> None:
        if self.first_chunk_at is None:
            self.first_chunk_at = 0.0
        self.saw_bytes = self.saw_bytes or bool(chunk.strip())
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        needs_frames = len(self.head) < HEAD_CHARS or self.recognised is None
        for raw in lines:
            line = raw.strip()
            if not line:
                continue
            frame = line[5:].strip() if line.startswith(b"data:") else line
            if self.dialect == OPENAI and not line.startswith(b"data:"):
                continue
            self._last = frame
            if frame.startswith(b"{"):
                self.last_object = frame
            if self.dialect == OPENAI and frame.startswith(b'{"error"'):
                self.error_frame = True
            if needs_frames or b'"error"' in frame[:16]:
                self._look(frame)
            if self.dialect == OPENAI and not self.final_seen and (frame == b"[DONE]" or b"finish_reason" in frame):
                self.final_seen = self.final_seen or self.is_final(self.dialect, frame)

    def _look(self, frame: bytes) -> None:
        if frame == b"[DONE]":
            return
        try:
            obj = json.loads(frame)
        except ValueError:
            if self.recognised is None:
                self.recognised = False
            return
        if self.recognised is None:
            self.recognised = isinstance(obj, dict)
        if isinstance(obj, dict) and "error" in obj and self.dialect == OPENAI:
            self.error_frame = True
        if len(self.head) < HEAD_CHARS:
            self.head += _text_of(obj, self.dialect)


PIECES = st.sampled_from(["<unused0>", "<unused12>", " ", "\n", "<unused٣>", "hello", "x", "é", "unused", "<>",
                          "42", "<unused7> <unused8>", "d", "  \t"])
TEXTS = st.lists(PIECES, max_size=6).map("".join)


def _openai_frame(kind: str, text: str) -> bytes:
    if kind == "delta":
        return b"data: " + json.dumps({"choices": [{"delta": {"content": text}, "finish_reason": None}]}).encode()
    if kind == "error-late":
        return b"data: " + json.dumps({"id": "x" * 20, "object": "chunk", "error": {"message": text}}).encode()
    if kind == "error-first":
        return b"data: " + json.dumps({"error": {"message": text}}).encode()
    if kind == "final":
        return b"data: " + json.dumps({"choices": [{"delta": {}, "finish_reason": "stop"}]}).encode()
    if kind == "done":
        return b"data: [DONE]"
    if kind == "comment":
        return b": keep-alive"
    return b"data: {not json"


def _native_frame(kind: str, text: str) -> bytes:
    if kind == "final":
        return json.dumps({"message": {"role": "assistant", "content": text}, "done": True}).encode()
    if kind in ("error-late", "error-first"):
        return json.dumps({"error": text}).encode()
    if kind == "garbage":
        return b"{not json"
    return json.dumps({"message": {"role": "assistant", "content": text}, "done": False}).encode()


KINDS = st.sampled_from(["delta", "delta", "delta", "error-late", "error-first", "final", "done", "comment",
                         "garbage"])


@settings(max_examples=400, deadline=None)
@given(dialect=st.sampled_from([OPENAI, NATIVE]), frames=st.lists(st.tuples(KINDS, TEXTS), max_size=40),
       cuts=st.lists(st.integers(min_value=1, max_value=97), max_size=8), dropped=st.booleans())
def test_verdicts_match_the_judge_that_parses_every_frame(dialect, frames, cuts, dropped):
    make = _openai_frame if dialect == OPENAI else _native_frame
    stream = b"".join(make(kind, text) + b"\n" for kind, text in frames)
    pieces, at = [], 0
    for cut in cuts:  # arbitrary chunk boundaries, as a socket delivers them
        pieces.append(stream[at:at + cut])
        at += cut
    pieces.append(stream[at:])
    fast, reference = StreamJudge(dialect, _final), ParseEveryFrame(dialect, _final)
    for piece in pieces:
        fast.feed(piece)
        reference.feed(piece)
    assert fast.verdict(dropped=dropped) == reference.verdict(dropped=dropped)
    assert (fast.recognised, fast.error_frame, fast.final_seen, fast.last_object) == \
        (reference.recognised, reference.error_frame, reference.final_seen, reference.last_object)


def test_a_placeholder_head_is_still_degenerate_and_a_text_head_stops_the_parsing():
    frames = [b"data: " + json.dumps({"choices": [{"delta": {"content": "<unused3> "}, "finish_reason": None}]}).encode()
              for _ in range(20)]  # 200 characters: the whole head, nothing but placeholders
    frames.append(b"data: " + json.dumps({"choices": [{"delta": {}, "finish_reason": "stop"}]}).encode())
    judge, reference = StreamJudge(OPENAI, _final), ParseEveryFrame(OPENAI, _final)
    judge.feed(b"\n".join(frames) + b"\n")
    reference.feed(b"\n".join(frames) + b"\n")
    assert judge.verdict() == reference.verdict() == output_check.DEGENERATE
    parsed = []
    judge = StreamJudge(OPENAI, _final)
    original = judge._look
    judge._look = lambda frame: (parsed.append(frame), original(frame))  # type: ignore[method-assign]
    text = [b"data: " + json.dumps({"choices": [{"delta": {"content": "Hello"}, "finish_reason": None}]}).encode()
            for _ in range(30)]
    judge.feed(b"\n".join(text) + b"\n")
    assert len(parsed) == 1  # the first frame decided it
    assert judge.verdict() == output_check.TRUNCATED  # no final frame: still judged


PLACEHOLDER = st.builds(lambda n, pad: f"{pad}<unused{n}>", st.integers(min_value=0, max_value=10**6),
                        st.sampled_from(["", " ", "\n", "  \t"]))


@settings(max_examples=300, deadline=None)
@given(run=st.lists(PLACEHOLDER, min_size=1, max_size=80), tail=st.sampled_from(["", " ", "\n"]))
def test_nothing_but_placeholders_is_degenerate_wherever_the_head_cuts_the_last(run, tail):
    """Issue 26.10: a run longer than the head ends in a placeholder cut in half (``<unu``);
    it is degenerate all the same, at any length and any split point."""
    text = "".join(run) + tail
    assert output_check.degenerate(text)
    judge = StreamJudge(OPENAI, _final)
    for piece in run:  # one frame per placeholder, as an engine streams them
        judge.feed(b"data: " + json.dumps({"choices": [{"delta": {"content": piece}}]}).encode() + b"\n")
    judge.feed(b"data: " + json.dumps({"choices": [{"delta": {}, "finish_reason": "stop"}]}).encode() + b"\n")
    assert judge.verdict() == output_check.DEGENERATE


@settings(max_examples=300, deadline=None)
@given(run=st.lists(PLACEHOLDER, max_size=40), word=st.sampled_from(["a", "hello", "unused5>", "x<unused1>", "é"]),
       after=st.lists(PLACEHOLDER, max_size=40))
def test_a_word_within_the_head_makes_it_an_answer(run, word, after):
    head = "".join(run)
    if len(head) >= HEAD_CHARS:
        return  # the word lies past the head: what the head holds is all placeholders
    assert not output_check.degenerate(head + word + "".join(after))


@pytest.mark.parametrize("text", [
    "<unused49>" * 25 + "<unu",  # 254 characters: the text itself ends there, the head cut nothing
    "<unused49>" * 10 + "<unused>" + "<unused49>" * 30,  # no number: not a placeholder
    "<unused49>" * 10 + "<used3>" + "<unused49>" * 30,
    "<unused49>" * 25 + "<x" + "<unused49>" * 30,  # cut at the edge, but not a placeholder's start
])
def test_what_only_looks_like_placeholders_is_an_answer(text):
    assert not output_check.degenerate(text)
