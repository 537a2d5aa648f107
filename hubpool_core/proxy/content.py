"""What a stream's frames say, read cheaply as they pass (issue 28): whether an engine has sent
real content yet, whether a chunk is nothing but keep-alives, and the generated text a loop
is looked for in.

Real content is what an app can show or act on: text, reasoning, a tool call, the answer's
end, an error. A role-only or empty delta, ``message_start`` and an empty text block's
start, ``response.created``, a ``ping`` event and an SSE comment are not: an engine wedged
in prefill sends exactly those and then nothing, so a stream is committed to the app only
at its first real frame (docs/reliability.md, "First real token"). A frame that is not
recognisably the dialect counts as real: what the node cannot read, it does not hold back.
"""

from __future__ import annotations

import json
import re
from typing import Any

from hubpool_core.engine import MESSAGES, NATIVE, RESPONSES

#: the Responses events that carry nothing an app shows (the answer's shell and empty parts)
_RESPONSES_OPENING = frozenset({"response.created", "response.in_progress", "response.queued",
                                "response.content_part.added"})


def _nonempty(value: Any) -> bool:
    return bool(value) and (isinstance(value, (str, list, dict)))


def real_frame(dialect: str, frame: bytes) -> bool:
    """Whether one frame (an SSE ``data:`` payload, or an NDJSON line) of ``dialect`` carries
    real content."""
    if frame == b"[DONE]":
        return True  # the end of an answer, however empty: the judge reads it from here
    try:
        obj = json.loads(frame)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return True
    if not isinstance(obj, dict):
        return True
    if "error" in obj and dialect not in (MESSAGES, RESPONSES):
        return True
    if dialect == NATIVE:
        if obj.get("done") is True:
            return True
        msg = m if isinstance(m := obj.get("message"), dict) else {}
        return any(_nonempty(v) for v in (msg.get("content"), msg.get("thinking"), msg.get("tool_calls"),
                                          obj.get("response"), obj.get("thinking")))
    if dialect == MESSAGES:
        kind = obj.get("type")
        if kind in ("message_start", "ping", "content_block_stop"):
            return False
        if kind == "content_block_start":
            block = b if isinstance(b := obj.get("content_block"), dict) else {}
            # an empty text or thinking block opens; a tool_use block already names its tool
            return block.get("type") not in ("text", "thinking", "redacted_thinking") or _nonempty(block.get("text"))
        if kind == "content_block_delta":
            delta = d if isinstance(d := obj.get("delta"), dict) else {}
            return any(_nonempty(v) for k, v in delta.items() if k != "type")
        return True  # message_delta, message_stop, error, and what this node does not know
    if dialect == RESPONSES:
        kind = obj.get("type")
        if kind in _RESPONSES_OPENING:
            return False
        if kind == "response.output_item.added":
            item = i if isinstance(i := obj.get("item"), dict) else {}
            return item.get("type") not in ("message", "reasoning")
        if isinstance(kind, str) and kind.endswith(".delta"):
            return _nonempty(obj.get("delta"))
        return True
    # the OpenAI dialect: chat and completion chunks
    for choice in obj.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        if choice.get("finish_reason"):
            return True
        delta = d if isinstance(d := choice.get("delta"), dict) else {}
        message = m if isinstance(m := choice.get("message"), dict) else {}
        if any(_nonempty(v) for v in (delta.get("content"), delta.get("reasoning_content"), delta.get("reasoning"),
                                       delta.get("tool_calls"), delta.get("function_call"), choice.get("text"),
                                       message.get("content"), message.get("tool_calls"))):
            return True
    return False


class FirstContent:
    """Fed the first chunks of a stream in the engine's dialect; ``seen`` from the chunk that
    completes a frame with real content."""

    __slots__ = ("dialect", "sse", "seen", "_partial")

    def __init__(self, dialect: str):
        self.dialect = dialect
        self.sse = dialect != NATIVE
        self.seen = False
        self._partial = b""

    def feed(self, chunk: bytes) -> bool:
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            line = raw.strip()
            if not line:
                continue
            if self.sse:
                if not line.startswith(b"data:"):
                    continue  # an event name or a comment
                line = line[5:].strip()
            if real_frame(self.dialect, line):
                self.seen = True
                return True
        return False

    def end(self) -> bool:
        """The stream ended: a last line without its newline counts too."""
        return self.feed(b"\n") if self._partial.strip() else self.seen


def only_keepalives(chunk: bytes) -> bool:
    """Whether a chunk holds nothing but keep-alives (SSE comments, ``ping`` events, blank
    lines): those are not progress, so they cannot hold off a stall."""
    if b"ping" not in chunk and not chunk.lstrip().startswith(b":"):
        return False  # the common case, decided without splitting
    for raw in chunk.split(b"\n"):
        line = raw.strip()
        if not line or line.startswith(b":") or line in (b"event: ping", b"event:ping"):
            continue
        if line.startswith(b"data:") and len(line) < 48 and b'"ping"' in line:
            continue
        return False
    return True


# The generated text in a chunk, as the JSON strings that carry it (escapes kept: a loop
# repeats them as faithfully as the text). One search per chunk, no JSON parse.
_STRING = rb'"((?:[^"\\]|\\.)*)"'
_TEXT_FIELDS = {
    NATIVE: re.compile(rb'"(?:content|thinking|response)":\s*' + _STRING),
    MESSAGES: re.compile(rb'"(?:text|thinking|partial_json)":\s*' + _STRING),
    # only the deltas: the .done events and response.completed repeat the whole text
    RESPONSES: re.compile(rb'"delta":\s*' + _STRING),
}
_OPENAI_TEXT = re.compile(rb'"(?:content|reasoning_content|reasoning|text|arguments)":\s*' + _STRING)


def text_pattern(dialect: str) -> re.Pattern[bytes]:
    """What :func:`generated_text` searches a chunk of ``dialect`` with."""
    return _TEXT_FIELDS.get(dialect, _OPENAI_TEXT)


def generated_text(pattern: re.Pattern[bytes], chunk: bytes) -> bytes:
    """The generated text in a chunk (its JSON strings, escapes kept), joined. A string cut
    between two chunks is missed: a loop repeats, so it is seen in the next repetition."""
    return b"".join(pattern.findall(chunk))
