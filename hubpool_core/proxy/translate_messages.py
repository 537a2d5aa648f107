"""Anthropic Messages requests served by an engine that speaks only chat completions.

``/v1/messages`` becomes ``/v1/chat/completions`` and the answer comes back as a Messages
body or event stream (``message_start`` … ``message_stop``); ``/v1/messages/count_tokens``
becomes a one-token completion whose ``usage.prompt_tokens`` is the count (the engine's own
tokenizer and template; the prefill it costs warms the prompt cache for the turn that
follows), never below the pool's own estimate of the prompt (bytes / 4 of its text): an
engine that reports only the tokens it evaluated (Ollama, after a prompt-cache hit) would
otherwise under-count a prompt it has seen before. What survives and what does not is in
docs/translation.md. A stream gets its ``message_delta`` and ``message_stop`` only when the
engine really finished: a cut stream stays visibly cut.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

from hubpool_core.engine import OPENAI
from hubpool_core.proxy.translate_chat import (
    ChatStreamReader,
    StreamClosing,
    content_text,
    parse_arguments,
    read_answer,
    read_whole,
    usage_tokens,
)

COUNT_ROUTE = "/v1/messages/count_tokens"
#: roles a message inside ``messages`` may carry that chat completions reads as a system message
SYSTEM_ROLES = ("system", "developer")
#: chat finish_reason -> Messages stop_reason
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use",
                "content_filter": "refusal"}
#: HTTP status -> Anthropic's error type
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error shape for ``status``."""
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _sse(event: str, payload: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


def _image_part(source: Any) -> dict[str, Any] | None:
    if not isinstance(source, dict):
        return None
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        url = f"data:{source.get('media_type') or 'image/png'};base64,{source['data']}"
    elif source.get("type") == "url" and isinstance(source.get("url"), str):
        url = source["url"]
    else:
        return None
    return {"type": "image_url", "image_url": {"url": url}}


def _message(msg: Any) -> list[dict[str, Any]]:
    """One Messages turn as chat messages: a ``system`` (or ``developer``) message stays a
    system message in place, tool results become ``tool`` messages (first, as chat
    templates expect them right after the calls), tool_use blocks the assistant's
    ``tool_calls``; thinking and documents are dropped."""
    if not isinstance(msg, dict):
        return []
    content = msg.get("content")
    if msg.get("role") in SYSTEM_ROLES:
        # Claude Code puts its environment block in a system message inside messages on
        # every turn: it stays a system message, where it was
        return [{"role": "system", "content": content_text(content)}]
    role = msg.get("role") if msg.get("role") in ("user", "assistant") else "user"
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for block in content if isinstance(content, list) else []:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and (image := _image_part(block.get("source"))) is not None:
            parts.append(image)
        elif kind == "tool_use":
            calls.append({"id": block.get("id"), "type": "function",
                          "function": {"name": block.get("name"), "arguments": json.dumps(block.get("input") or {})}})
        elif kind == "tool_result":
            text = content_text(block.get("content"))
            out.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                        "content": f"Error: {text}" if block.get("is_error") else text})
    if parts or calls:
        if all(p["type"] == "text" for p in parts):
            body: Any = "".join(p["text"] for p in parts)
        else:
            body = parts
        turn: dict[str, Any] = {"role": role, "content": body if (body or not calls) else None}
        if calls and role == "assistant":
            turn["tool_calls"] = calls
        out.append(turn)
    return out


def _tools(tools: Any) -> list[dict[str, Any]]:
    out = []
    for tool in tools if isinstance(tools, list) else []:
        # server tools (web search, code execution) carry no input_schema: nothing to call locally
        if isinstance(tool, dict) and isinstance(tool.get("name"), str) and isinstance(tool.get("input_schema"), dict):
            fn = {"name": tool["name"], "parameters": tool["input_schema"]}
            if isinstance(tool.get("description"), str):
                fn["description"] = tool["description"]
            out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> Any:
    if not isinstance(choice, dict):
        return None
    kind = choice.get("type")
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    return {"auto": "auto", "any": "required", "none": "none"}.get(kind) if isinstance(kind, str) else None


def chat_request(body: dict[str, Any], stream: bool) -> dict[str, Any]:
    """A Messages body as a chat-completions body."""
    messages: list[dict[str, Any]] = []
    system = content_text(body.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    turns = body.get("messages")
    for msg in turns if isinstance(turns, list) else []:
        messages += _message(msg)
    out: dict[str, Any] = {"model": body.get("model"), "stream": stream}
    if isinstance(turns, list):
        out["messages"] = messages
    elif "messages" in body:  # not a list: the engine refuses it in its own words
        out["messages"] = turns
    for ours, theirs in (("max_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                         ("top_k", "top_k"), ("stop_sequences", "stop")):
        if body.get(ours) is not None:
            out[theirs] = body[ours]
    tools = _tools(body.get("tools"))
    if tools:
        out["tools"] = tools
        choice = _tool_choice(body.get("tool_choice"))
        if choice is not None:
            out["tool_choice"] = choice
        if isinstance(body.get("tool_choice"), dict) and body["tool_choice"].get("disable_parallel_tool_use"):
            out["parallel_tool_calls"] = False
    if stream:
        out["stream_options"] = {"include_usage": True}
    return out


class MessagesToChat(StreamClosing):
    """One translated Messages exchange (or a count_tokens one): built from the request,
    then fed the engine's answer."""

    upstream_dialect = OPENAI
    stream_content_type = b"text/event-stream"
    upstream_route = "/v1/chat/completions"

    def __init__(self, route: str, body: dict[str, Any], stream: bool):
        self.counting = route == COUNT_ROUTE
        self.model = body.get("model")
        self.upstream_body = chat_request(body, stream and not self.counting)
        self.estimate = 0
        if self.counting:
            self.upstream_body.update(max_tokens=1, stream=False)
            self.upstream_body.pop("stream_options", None)
            turns = self.upstream_body.get("messages")
            text = "".join(m["content"] if isinstance(m.get("content"), str) else json.dumps(m.get("content"))
                           for m in (turns if isinstance(turns, list) else []))
            self.estimate = -(-len((text + json.dumps(self.upstream_body.get("tools", ""))).encode()) // 4)
        self.id = f"msg_{uuid.uuid4().hex[:24]}"
        self._reader = ChatStreamReader()
        self._started = False
        self._block: tuple[str, int] | None = None  # ("text" | "tool", call index) of the open block
        self._blocks = 0
        self._tool_blocks: dict[int, int] = {}
        super().__init__()

    # -- whole answers -----------------------------------------------------------
    def whole(self, status: int, raw: bytes) -> bytes:
        body, error = read_whole(status, raw)
        if body is None:
            return json.dumps(error_body(*error)).encode() if error else b""
        answer = read_answer(body)
        prompt, completion = usage_tokens(answer.usage)
        if self.counting:
            return json.dumps({"input_tokens": max(prompt or 0, self.estimate)}).encode()
        content: list[dict[str, Any]] = []
        if answer.text:
            content.append({"type": "text", "text": answer.text})
        content += [{"type": "tool_use", "id": c.call_id, "name": c.name or "", "input": parse_arguments(c.arguments)}
                    for c in answer.calls]
        return json.dumps({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
            # no finish_reason: the engine never finished, and the answer says so
            "stop_reason": STOP_REASONS.get(answer.finish, "end_turn") if answer.finish else None,
            "stop_sequence": None, "usage": {"input_tokens": prompt or 0, "output_tokens": completion or 0},
        }).encode()

    # -- streams -----------------------------------------------------------------
    def feed(self, chunk: bytes) -> Iterator[bytes]:
        for event in self._reader.events(chunk):
            if not self._started:
                self._started = True
                yield self._message_start()
            if event.text is not None:
                yield from self._open("text", 0)
                yield _sse("content_block_delta", {"type": "content_block_delta", "index": self._blocks - 1,
                                                   "delta": {"type": "text_delta", "text": event.text}})
            elif event.tool is not None:
                piece = event.tool
                if piece.index not in self._tool_blocks:
                    yield from self._close()
                    self._tool_blocks[piece.index] = self._blocks
                    self._block = ("tool", piece.index)
                    self._blocks += 1
                    block = {"type": "tool_use", "id": piece.call_id or f"toolu_{uuid.uuid4().hex[:24]}",
                             "name": piece.name or "", "input": {}}
                    yield _sse("content_block_start", {"type": "content_block_start",
                                                       "index": self._tool_blocks[piece.index],
                                                       "content_block": block})
                if piece.arguments:
                    yield _sse("content_block_delta", {"type": "content_block_delta",
                                                       "index": self._tool_blocks[piece.index],
                                                       "delta": {"type": "input_json_delta",
                                                                 "partial_json": piece.arguments}})
            elif self.noted(event):
                pass
            elif event.error is not None:
                yield _sse("error", error_body(500, event.error))
            elif event.done:
                yield from self.end()

    def end(self) -> Iterator[bytes]:
        """The engine's stream ended (or said [DONE]): close the message only if it finished."""
        if not self.closing():
            return
        if not self._started:
            self._started = True
            yield self._message_start()
        yield from self._close()
        prompt, completion = usage_tokens(self._usage)
        usage = {"output_tokens": completion or 0}
        if prompt is not None:
            usage["input_tokens"] = prompt
        yield _sse("message_delta", {"type": "message_delta",
                                     "delta": {"stop_reason": STOP_REASONS.get(self._finish or "", "end_turn"),
                                               "stop_sequence": None}, "usage": usage})
        yield _sse("message_stop", {"type": "message_stop"})

    def _message_start(self) -> bytes:
        message: dict[str, Any] = {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}
        return _sse("message_start", {"type": "message_start", "message": message})

    def _open(self, kind: str, key: int) -> Iterator[bytes]:
        if self._block == (kind, key):
            return
        yield from self._close()
        self._block = (kind, key)
        self._blocks += 1
        yield _sse("content_block_start", {"type": "content_block_start", "index": self._blocks - 1,
                                           "content_block": {"type": "text", "text": ""}})

    def _close(self) -> Iterator[bytes]:
        if self._block is None:
            return
        index = self._tool_blocks[self._block[1]] if self._block[0] == "tool" else self._blocks - 1
        self._block = None
        yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
