"""Resuming a stream on another engine (issue 28 item 4; ``poolStreamResume``, default 0 — a
departure from the spec, whose rule is that an answer that has started is never moved).

When a committed stream is cut mid-answer — its node killed or unreachable, stalled, looping —
and everything the app has been sent is answer text (no tool call, no reasoning), the walk
sends the same request to the next candidate with the text so far as the assistant's message
to continue (llama-server and Ollama continue a trailing assistant message; vLLM does with
``continue_final_message``, which is sent too), its token budget reduced by the tokens already
sent, and splices the continuation into the same stream: the app sees one answer, with no
second role chunk, ``message_start`` or ``response.created``, the first attempt's ids,
content-block index and item, sequence numbers that continue, and usage summed. An engine
that sends the partial text back before continuing it (llama-server, on the routes where it
cannot be told not to) has that repeat dropped. Anything else cut ends with the dialect's
error event.

:class:`Resume` reads the app's side of the stream (the frames as the app gets them, in its
dialect) — every frame is parsed, which is why it is off by default — and rewrites a
continuation's frames. It knows the four streamed dialects: OpenAI chat SSE, Ollama's NDJSON
chat, Anthropic Messages and OpenAI Responses.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hubpool_core.engine import MESSAGES, NATIVE, OPENAI, RESPONSES, answer_limit

#: the routes a stream can be resumed on: a conversation with a trailing assistant message
RESUMABLE_ROUTES = frozenset({"/v1/chat/completions", "/api/chat", "/v1/messages", "/v1/responses"})


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


class Resume:
    """One resumable stream's state on the app's side (see the module docstring)."""

    def __init__(self, dialect: str):
        self.dialect = dialect
        self.sse = dialect != NATIVE
        self.text = ""
        self.tokens = 0
        #: False once the app saw something a continuation cannot carry on (a tool call,
        #: reasoning, an error, the answer's end)
        self.sound = True
        self.continuing = False
        self.cut: str | None = None
        self._partial = b""
        # what the app's stream is: its ids, the open text block / item, the next sequence number
        self.ident: dict[str, Any] = {}
        self.block: int | None = None
        self.seq = 0
        #: the text a continuation was asked to carry on from, until its first text arrives
        self._echo: str | None = None

    # -- reading the app's side ------------------------------------------------------------
    def wrap(self, outs: Any) -> list[bytes]:
        """What goes to the app for ``outs`` (the bytes an attempt would send): the first
        attempt's as they are, read on the way; a continuation's rewritten."""
        data = self._partial + b"".join(outs)
        if not data:
            return []
        sep = b"\n\n" if self.sse else b"\n"
        frames = data.split(sep)
        self._partial = frames.pop()
        out = []
        for frame in frames:
            if not frame.strip():
                continue
            rewritten = self._frame(frame)
            if rewritten is not None:
                out.append(rewritten + sep)
        return [b"".join(out)] if out else []

    def _frame(self, frame: bytes) -> bytes | None:
        event: str | None = None
        data: bytes | None = frame
        if self.sse:
            event, data = _split_sse(frame)
        if data is None:
            return frame  # a comment
        if data == b"[DONE]":
            return frame
        try:
            obj = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError):
            self.sound = False
            return frame
        if not isinstance(obj, dict):
            return frame
        handler = {OPENAI: self._openai, NATIVE: self._native, MESSAGES: self._messages,
                   RESPONSES: self._responses}[self.dialect]
        rewritten = handler(obj)
        if not self.continuing:
            return frame  # the first attempt's bytes go to the app as they came
        if rewritten is None:
            return None
        body = _dumps(rewritten).encode()
        if not self.sse:
            return body
        name = event if event is not None else None
        return (b"event: " + name.encode() + b"\n" if name else b"") + b"data: " + body

    def _openai(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        if "error" in obj:
            self.sound = False
            return obj
        if self.continuing:
            for key in ("id", "created", "model"):
                if key in self.ident:
                    obj[key] = self.ident[key]
        else:
            for key in ("id", "created", "model"):
                if key in obj and key not in self.ident:
                    self.ident[key] = obj[key]
        for choice in obj.get("choices") or []:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                continue
            if self.continuing:
                delta.pop("role", None)
            if delta.get("tool_calls") or delta.get("reasoning_content") or delta.get("reasoning"):
                self.sound = False
            text = delta.get("content")
            if self.continuing and isinstance(text, str) and text:
                text = self._fresh(text)
                if text:
                    delta["content"] = text
                else:
                    del delta["content"]
            if isinstance(text, str) and text:
                self.text += text
                self.tokens += 1
            if choice.get("finish_reason"):
                self.sound = False
        usage = obj.get("usage")
        if self.continuing and isinstance(usage, dict):
            _add_tokens(usage, "completion_tokens", self.resumed_tokens, "total_tokens")
        if self.continuing and not obj.get("choices") and not isinstance(usage, dict):
            return None
        choices = [c for c in obj.get("choices") or [] if isinstance(c, dict)]
        if self.continuing and choices and all(not c.get("delta") and not c.get("finish_reason") for c in choices):
            return None  # a role-only chunk, its role removed: nothing left to send
        return obj

    def _native(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        if "error" in obj or obj.get("done") is True:
            self.sound = False
            if self.continuing and obj.get("done") is True:
                _add_tokens(obj, "eval_count", self.resumed_tokens)
            return obj
        message = m if isinstance(m := obj.get("message"), dict) else {}
        if message.get("tool_calls") or message.get("thinking"):
            self.sound = False
        text = message.get("content")
        if self.continuing and isinstance(text, str) and text:
            text = message["content"] = self._fresh(text)
        if isinstance(text, str) and text:
            self.text += text
            self.tokens += 1
        elif self.continuing:
            return None
        return obj

    def _messages(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        kind = obj.get("type")
        if kind == "message_start":
            if self.continuing:
                return None
            message = m if isinstance(m := obj.get("message"), dict) else {}
            self.ident = {"id": message.get("id"), "model": message.get("model")}
            return obj
        if kind == "ping":
            return None if self.continuing else obj
        if kind == "content_block_start":
            block = obj.get("content_block") or {}
            if block.get("type") != "text":
                self.sound = False
                return obj
            if self.continuing and self.block is not None:
                return None  # the app's text block is still open
            self.block = obj.get("index")
            return obj
        if kind == "content_block_delta":
            delta = obj.get("delta") or {}
            if delta.get("type") != "text_delta":
                self.sound = False
                return obj
            if self.continuing:
                delta["text"] = self._fresh(delta.get("text") or "")
                if not delta["text"]:
                    return None
                if self.block is not None:
                    obj["index"] = self.block
            self.text += delta.get("text") or ""
            self.tokens += 1
            return obj
        if kind == "content_block_stop":
            if self.continuing and self.block is not None:
                obj["index"] = self.block
            self.block = None
            return obj
        if kind == "message_delta":
            self.sound = False
            if self.continuing:
                _add_tokens(obj.setdefault("usage", {}), "output_tokens", self.resumed_tokens)
            return obj
        self.sound = False  # message_stop, error, and what this node does not know
        return obj

    def _responses(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        kind = obj.get("type")
        if self.continuing:
            if kind in ("response.created", "response.in_progress", "response.content_part.added"):
                return None
            if kind == "response.output_item.added" and (obj.get("item") or {}).get("type") == "message":
                return None
        response = obj.get("response") if isinstance(obj.get("response"), dict) else None
        if response is not None:
            if self.continuing:
                response["id"] = self.ident.get("id", response.get("id"))
            elif kind == "response.created":
                self.ident["id"] = response.get("id")
        if kind == "response.output_item.added":
            item = obj.get("item") or {}
            if item.get("type") != "message":
                self.sound = False
            else:
                self.ident["item"] = item.get("id")
                self.ident["output_index"] = obj.get("output_index", 0)
        elif kind == "response.output_text.delta":
            if self.continuing:
                obj["delta"] = self._fresh(obj.get("delta") or "")
                if not obj["delta"]:
                    return None
            self.text += obj.get("delta") or ""
            self.tokens += 1
        elif kind in ("response.output_text.done", "response.content_part.done", "response.output_item.done",
                      "response.completed", "response.incomplete", "response.failed", "error"):
            self.sound = False
        elif kind != "response.content_part.added" and kind not in ("response.created", "response.in_progress"):
            self.sound = False  # reasoning, tool arguments, and what this node does not know
        if self.continuing:
            self._continue_responses(obj)
        if isinstance(obj.get("sequence_number"), int):
            if self.continuing:
                obj["sequence_number"] = self.seq
            self.seq = obj["sequence_number"] + 1
        return obj

    def _continue_responses(self, obj: dict[str, Any]) -> None:
        """A continuation's event, made the first attempt's: its item, and the whole text."""
        item_id, index = self.ident.get("item"), self.ident.get("output_index", 0)
        if "item_id" in obj and item_id:
            obj["item_id"], obj["output_index"] = item_id, index
        if obj.get("type") == "response.output_text.done":
            obj["text"] = self.text
        part = obj.get("part")
        if isinstance(part, dict) and "text" in part:
            part["text"] = self.text
        item = obj.get("item")
        if isinstance(item, dict) and item.get("type") == "message":
            item["id"] = item_id or item.get("id")
            obj["output_index"] = index
            _whole_text(item, self.text)
        response = obj.get("response")
        if isinstance(response, dict):
            for out in response.get("output") or []:
                if isinstance(out, dict) and out.get("type") == "message":
                    out["id"] = item_id or out.get("id")
                    _whole_text(out, self.text)
            if isinstance(response.get("usage"), dict):
                _add_tokens(response["usage"], "output_tokens", self.resumed_tokens, "total_tokens")

    # -- continuing ------------------------------------------------------------------------
    def can_continue(self) -> bool:
        return self.sound and bool(self.text)

    def start_continuation(self) -> None:
        """The next attempt's frames are a continuation: rewritten from here on."""
        self.continuing = True
        self.resumed_tokens = self.tokens
        self._partial = b""
        self._echo = self.text

    def _fresh(self, text: str) -> str:
        """A continuation's text without the engine's repeat of the text it was asked to
        carry on from. llama-server's prefill sends that text back at the start of its answer
        wherever it cannot be told not to (Messages, Responses, and chat completions without
        ``continue_final_message``): its first text frame begins with all of it. Only the
        first text frame is looked at."""
        echo, self._echo = self._echo, None
        return text[len(echo):] if echo and text.startswith(echo) else text

    resumed_tokens = 0

    def body(self, dialect: str, route: str, body: dict[str, Any]) -> dict[str, Any]:
        """The request again, asking the engine to continue the text the app has."""
        out = copy.deepcopy(body)
        left = None
        if dialect == RESPONSES:
            given = out.get("input")
            items = [{"type": "message", "role": "user", "content": given}] if isinstance(given, str) \
                else list(given or [])
            items.append({"type": "message", "role": "assistant",
                          "content": [{"type": "output_text", "text": self.text}]})
            out["input"] = items
        elif dialect == NATIVE:
            out["messages"] = [*out.get("messages", []), {"role": "assistant", "content": self.text}]
            out.setdefault("options", {})
        else:
            messages = list(out.get("messages", []))
            messages.append({"role": "assistant", "content": self.text})
            out["messages"] = messages
            if dialect == OPENAI:
                # vLLM continues a final assistant message only when told; others ignore these
                out["continue_final_message"], out["add_generation_prompt"] = True, False
        limit = answer_limit(out, dialect)
        if limit is not None:
            holder, key, asked = limit
            # the answer so far spent part of the budget the app set
            holder[key] = left = asked - self.tokens
        if left is not None and left < 1:
            raise ValueError("the answer had spent its whole token budget")
        return out


def _add_tokens(usage: dict[str, Any], key: str, tokens: int, total: str | None = None) -> None:
    if isinstance(usage.get(key), int):
        usage[key] += tokens
    if total is not None and isinstance(usage.get(total), int):
        usage[total] += tokens


def _whole_text(item: dict[str, Any], text: str) -> None:
    for part in item.get("content") or []:
        if isinstance(part, dict) and "text" in part:
            part["text"] = text


def _split_sse(frame: bytes) -> tuple[str | None, bytes | None]:
    event, data = None, None
    for line in frame.split(b"\n"):
        line = line.strip()
        if line.startswith(b"event:"):
            event = line[6:].strip().decode("utf-8", "replace")
        elif line.startswith(b"data:"):
            data = line[5:].strip()
    return event, data
