"""Judging a 200 that may not be an answer (spec: "A 200 that is not an answer").

Cut off (``truncated-upstream``): the dialect's final frame is missing, an OpenAI stream
carried an error frame, or the connection dropped. Degenerate (``degenerate-output``): the
first 256 characters of generated text, answer and reasoning together, are nothing but
``<unusedN>`` placeholders, the last possibly cut in half by the 256th character (a run of
them longer than the head never ends on its edge). A stream is judged on the way past from its first slice and last
line only; a body not recognisably in the dialect is not judged.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from hubpool_core.engine import MESSAGES, NATIVE, OPENAI, RESPONSES

COMPLETION_ROUTES = frozenset({"/api/chat", "/api/generate", "/v1/chat/completions", "/v1/completions",
                               "/v1/messages", "/v1/responses"})
TRUNCATED = "truncated-upstream"
DEGENERATE = "degenerate-output"
HEAD_CHARS = 256
MAX_JUDGED_BODY_BYTES = 4 * 1024 * 1024
FIRST_BYTES = 4096
_PLACEHOLDERS = re.compile(r"(?:\s*<unused\d+>)+\s*")
#: what is left of a placeholder cut at the head's edge: "<", "<unu", "<unused4"
_CUT_PLACEHOLDER = re.compile(r"<(?:u(?:n(?:u(?:s(?:e(?:d\d*)?)?)?)?)?)?")
#: a character no run of placeholders contains: once the head has one, it is not degenerate
_NOT_PLACEHOLDER = re.compile(r"[^\s\d<>unsed]")


def _text_of(obj: Any, dialect: str) -> str:
    """Generated text in one frame or body: answer and reasoning together."""
    if not isinstance(obj, dict):
        return ""
    if dialect == NATIVE:
        msg = m if isinstance(m := obj.get("message"), dict) else {}
        parts = [msg.get("content"), msg.get("thinking"), obj.get("response"), obj.get("thinking")]
    elif dialect == MESSAGES:
        delta = d if isinstance(d := obj.get("delta"), dict) else {}
        parts = [delta.get("text"), delta.get("thinking")]
        blocks = obj.get("content")
        for block in blocks if isinstance(blocks, list) else []:
            if isinstance(block, dict):
                parts += [block.get("text"), block.get("thinking")]
    elif dialect == RESPONSES:
        kind = obj.get("type")
        parts = [obj.get("delta")] if kind in ("response.output_text.delta", "response.reasoning_text.delta") else []
        output = obj.get("output")
        for item in output if isinstance(output, list) else []:
            content = item.get("content") if isinstance(item, dict) else None
            for part in content if isinstance(content, list) else []:
                if isinstance(part, dict):
                    parts.append(part.get("text"))
    else:
        parts = []
        for choice in obj.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            delta = d if isinstance(d := choice.get("delta"), dict) else {}
            message = m if isinstance(m := choice.get("message"), dict) else {}
            parts += [delta.get("content"), delta.get("reasoning_content"), delta.get("reasoning"),
                      message.get("content"), message.get("reasoning_content"), choice.get("text")]
    return "".join(p for p in parts if isinstance(p, str))


def degenerate(text: str) -> bool:
    """The first 256 characters are nothing but placeholders, the last possibly cut by the
    256th: a long run of them (``<unused49>`` is 10 characters) never ends on the edge."""
    head = text[:HEAD_CHARS]
    run = _PLACEHOLDERS.match(head)
    if run is None:
        return False
    rest = head[run.end():]
    return not rest or (len(text) > HEAD_CHARS and _CUT_PLACEHOLDER.fullmatch(rest) is not None)


def judge_whole(dialect: str, body: bytes) -> str | None:
    """A non-streamed completion body: None when it is an answer or not judgeable."""
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    if dialect == NATIVE:
        if "done" not in obj:
            return None  # not recognisably the dialect
        if obj.get("done") is not True:
            return TRUNCATED
    elif dialect == MESSAGES:
        if obj.get("type") != "message":
            return None
        if not obj.get("stop_reason"):
            return TRUNCATED
    elif dialect == RESPONSES:
        if obj.get("object") != "response":
            return None
        if obj.get("status") not in ("completed", "incomplete"):
            return TRUNCATED
    else:
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return None
        if not choices[0].get("finish_reason"):
            return TRUNCATED
    return DEGENERATE if degenerate(_text_of(obj, dialect)) else None


#: the bytes that may mark each SSE dialect's final frame (the frame is parsed only then)
_FINAL_MARKS = {OPENAI: (b"[DONE]", b"finish_reason"), MESSAGES: (b"message_stop",),
                RESPONSES: (b"response.completed", b"response.incomplete")}


def _may_be_final(dialect: str, frame: bytes) -> bool:
    return any(mark in frame for mark in _FINAL_MARKS.get(dialect, ()))


class StreamJudge:
    """Fed the bytes of a stream as they pass; ``verdict()`` at the end."""

    def __init__(self, dialect: str, is_final: Any):
        self.dialect = dialect
        self.sse = dialect != NATIVE  # every other dialect streams Server-Sent Events
        self.is_final = is_final  # (dialect, frame bytes) -> bool
        self.head = ""
        self.recognised: bool | None = None
        self.error_frame = False
        self.final_seen = False
        self._partial = b""
        self._last = b""
        self.last_object = b""
        #: the stream's first bytes (a Responses stream's id is there)
        self.first_bytes = b""
        self.first_chunk_at: float | None = None
        #: told once, at the first chunk (the slot clock: the answer is under way)
        self.on_first: Any = None
        self.saw_bytes = False
        #: the head already holds text no placeholder run has: degenerate() cannot hold, so
        #: frames are no longer parsed to collect it (that parse was 19 % of a stream's CPU)
        self._head_decided = False

    def feed(self, chunk: bytes) -> None:
        if self.first_chunk_at is None:
            self.first_chunk_at = time.monotonic()
            if self.on_first is not None:
                self.on_first()
        self.saw_bytes = self.saw_bytes or bool(chunk.strip())
        if len(self.first_bytes) < FIRST_BYTES:
            self.first_bytes += chunk[:FIRST_BYTES - len(self.first_bytes)]
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        collecting = len(self.head) < HEAD_CHARS
        needs_frames = (collecting and not self._head_decided) or self.recognised is None
        for raw in lines:
            line = raw.strip()
            if not line:
                continue
            frame = line[5:].strip() if line.startswith(b"data:") else line
            if self.sse and not line.startswith(b"data:"):
                continue  # SSE comments and event names
            self._last = frame
            if frame.startswith(b"{"):
                self.last_object = frame  # the final JSON frame carries the engine's timings
            if self.dialect == OPENAI and frame.startswith(b'{"error"'):
                self.error_frame = True
            # while the head is short every frame used to be parsed, which saw an "error" key
            # anywhere in it: the whole frame is searched for as long as that window lasts
            if needs_frames or b'"error"' in (frame if collecting else frame[:16]):
                self._look(frame)
                needs_frames = (len(self.head) < HEAD_CHARS and not self._head_decided) or self.recognised is None
            if self.sse and not self.final_seen and _may_be_final(self.dialect, frame):
                self.final_seen = self.final_seen or self.is_final(self.dialect, frame)

    def _look(self, frame: bytes) -> None:
        if frame == b"[DONE]":
            return
        try:
            obj = json.loads(frame)
        except (ValueError, UnicodeDecodeError, RecursionError):
            if self.recognised is None:
                self.recognised = False
            return
        if self.recognised is None:
            self.recognised = isinstance(obj, dict)
        if isinstance(obj, dict) and ("error" in obj if self.dialect == OPENAI else
                                      self.sse and obj.get("type") in ("error", "response.failed")):
            self.error_frame = True
        if len(self.head) < HEAD_CHARS and not self._head_decided:
            self.head += _text_of(obj, self.dialect)
            self._head_decided = _NOT_PLACEHOLDER.search(self.head[:HEAD_CHARS]) is not None

    def verdict(self, dropped: bool = False) -> str | None:
        if self._partial.strip():  # a last line without its newline
            self.feed(b"\n")
        if dropped:
            return TRUNCATED
        if not self.saw_bytes:
            # a 200 stream that ended with nothing at all lacks its final frame like any other cut
            # stream (a peer whose engine died just after its headers ends its reply this way)
            return TRUNCATED
        if not self.recognised:
            return None  # not judged
        if self.error_frame:
            return TRUNCATED
        if self.dialect == NATIVE:
            if not self.is_final(NATIVE, self._last):
                return TRUNCATED
        elif not self.final_seen:
            return TRUNCATED
        return DEGENERATE if degenerate(self.head) else None
