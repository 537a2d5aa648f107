"""Reading an engine's chat-completions answer for a translator that writes another dialect.

The agent dialects (Messages, Responses) are translated to ``/v1/chat/completions`` for an
engine that does not serve them; both translators read the answer the same way, so this
module holds that reading: a non-streamed body as one :class:`ChatAnswer`, and a stream as
:class:`ChatEvent` values, one per thing that happened (text, a piece of a tool call, the
finish, the usage, an error frame). The engine's JSON is read, not trusted: a field of the
wrong type is skipped, never an exception that cuts the app's stream.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from hubpool_core.engine import error_message


@dataclass
class ToolCallPiece:
    """Part of one tool call: its position among the answer's calls, and what arrived."""

    index: int
    call_id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class ChatEvent:
    """One thing a streamed chat completion said (exactly one field is set)."""

    text: str | None = None
    tool: ToolCallPiece | None = None
    finish: str | None = None
    usage: dict[str, Any] | None = None
    error: str | None = None
    done: bool = False  # data: [DONE]


@dataclass
class ChatAnswer:
    """A whole chat completion: text, tool calls (arguments as the engine's JSON string),
    the finish reason (None: the engine never finished) and usage."""

    id: str | None
    text: str
    calls: list[ToolCallPiece] = field(default_factory=list)
    finish: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)


def read_whole(status: int, raw: bytes) -> tuple[dict[str, Any] | None, tuple[int, str] | None]:
    """A whole answer from the engine: ``(its JSON object, None)``, or ``(None, (status,
    message))`` when it is an error or not a JSON object (a 2xx that is not JSON reads as 502),
    the message the engine's own (:func:`error_message`) or its first 2,000 characters."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError, UnicodeDecodeError):
        body = None
    if status < 400 and isinstance(body, dict):
        return body, None
    message = error_message(body) if isinstance(body, dict) else None
    return None, (status if status >= 400 else 502, message or raw.decode("utf-8", "replace")[:2000])


def read_answer(body: dict[str, Any]) -> ChatAnswer:
    choices = body.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = m if isinstance(m := choice.get("message"), dict) else {}
    calls = []
    for i, call in enumerate(message.get("tool_calls") or []):
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            args = fn.get("arguments")
            calls.append(ToolCallPiece(i, _text(call.get("id")) or f"call_{i}", _text(fn.get("name")),
                                       args if isinstance(args, str) else json.dumps(args or {})))
    usage: dict[str, Any] = u if isinstance(u := body.get("usage"), dict) else {}
    return ChatAnswer(_text(body.get("id")), _text(message.get("content")) or "", calls,
                      _text(choice.get("finish_reason")), usage)


def parse_arguments(text: str) -> Any:
    """A tool call's JSON arguments as an object; text that is not JSON is kept as a string
    under ``arguments``, never lost."""
    try:
        value = json.loads(text) if text else {}
    except (ValueError, RecursionError):
        return {"arguments": text}
    return value if isinstance(value, dict) else {"arguments": value}


class ChatStreamReader:
    """Fed the raw SSE bytes of a streamed chat completion; yields its events in order."""

    def __init__(self) -> None:
        self._buffer = b""

    def events(self, chunk: bytes) -> Iterator[ChatEvent]:
        self._buffer += chunk
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                yield ChatEvent(done=True)
                continue
            try:
                obj = json.loads(data)
            except (ValueError, RecursionError):
                continue
            if isinstance(obj, dict):
                yield from self._frame(obj)

    def _frame(self, obj: dict[str, Any]) -> Iterator[ChatEvent]:
        if "error" in obj:
            yield ChatEvent(error=error_message(obj) or "engine error")
            return
        for choice in obj.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            delta = d if isinstance(d := choice.get("delta"), dict) else {}
            # a chat chunk's delta, or a completion chunk's text
            text = delta.get("content") if "delta" in choice else choice.get("text")
            if isinstance(text, str) and text:
                yield ChatEvent(text=text)
            for call in delta.get("tool_calls") or []:
                if not isinstance(call, dict):
                    continue
                index = call.get("index", 0)
                fn = f if isinstance(f := call.get("function"), dict) else {}
                args = fn.get("arguments")
                yield ChatEvent(tool=ToolCallPiece(index if isinstance(index, int) and not isinstance(index, bool)
                                                   else 0, _text(call.get("id")), _text(fn.get("name")),
                                                   args if isinstance(args, str) else ""))
            if isinstance(finish := choice.get("finish_reason"), str) and finish:
                yield ChatEvent(finish=finish)
        if isinstance(obj.get("usage"), dict):
            yield ChatEvent(usage=obj["usage"])


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def content_text(content: Any, kinds: tuple[str, ...] = ("text",)) -> str:
    """The text of a content field: a string, or the ``text`` of blocks whose type is one of
    ``kinds`` (a block without a type counts), joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "".join(b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)
                   and b.get("type", kinds[0]) in kinds)


def usage_tokens(usage: dict[str, Any]) -> tuple[int | None, int | None]:
    """(prompt tokens, completion tokens) from an OpenAI usage object, None when absent."""
    def count(key: str) -> int | None:
        value = usage.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    return count("prompt_tokens"), count("completion_tokens")


class StreamClosing:
    """What a translated stream's ending needs, for both writers: how the engine finished,
    its usage, and whether the ending was written (once, and only if the engine finished)."""

    def __init__(self) -> None:
        self._finish: str | None = None
        self._usage: dict[str, Any] = {}
        self._closed = False

    def noted(self, event: ChatEvent) -> bool:
        """Record a finish or usage event; True when ``event`` was one."""
        if event.finish is not None:
            self._finish = event.finish
        elif event.usage is not None:
            self._usage = event.usage
        else:
            return False
        return True

    def closing(self) -> bool:
        """True exactly once, when the engine finished: the ending is to be written now."""
        if self._finish is None or self._closed:
            return False
        self._closed = True
        return True
