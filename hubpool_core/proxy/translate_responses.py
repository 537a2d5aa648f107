"""OpenAI Responses requests served by an engine that speaks only chat completions.

``/v1/responses`` becomes ``/v1/chat/completions``: ``instructions`` and the ``input`` items
(messages of any role, ``developer`` and ``system`` in place as system messages;
``function_call``/``custom_tool_call`` and their outputs) become messages; function tools stay
function tools, a ``custom`` tool (Codex's apply_patch) becomes a function with one string
``input`` parameter whose calls come back as ``custom_tool_call`` items, and hosted tools
(``web_search``, ``namespace``, …) and reasoning items are dropped; item ids are never looked
up. The answer comes back as a Response object or its event stream
(``response.created`` … ``response.completed``). Nothing is stored — the engine keeps no
state — so the answer says ``store: false``, and a ``previous_response_id`` is refused
before the request gets here. What survives and what does not is in docs/translation.md. A
stream gets ``response.completed`` only when the engine really finished.
"""

from __future__ import annotations

import json
import time
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

TEXT_KINDS = ("input_text", "output_text", "text")
OPENAI_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                      404: "not_found_error", 429: "rate_limit_error"}


def openai_error(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """The OpenAI error object (Responses, rerank, chat completions)."""
    kind = OPENAI_ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _sse(payload: dict[str, Any]) -> bytes:
    return f"event: {payload['type']}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


def _content(content: Any) -> Any:
    """A message item's content as chat content: text joined, images as image_url parts."""
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, dict):
            continue
        if part.get("type") in TEXT_KINDS and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif part.get("type") == "input_image":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            if isinstance(url, str):
                parts.append({"type": "image_url", "image_url": {"url": url}})
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def chat_messages(instructions: Any, items: Any) -> list[dict[str, Any]]:
    """``instructions`` and the ``input`` as chat messages; consecutive function calls are
    one assistant turn (parallel calls); reasoning items are dropped."""
    messages: list[dict[str, Any]] = []
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            role = "system" if role == "developer" else role if role in ("user", "assistant", "system") else "user"
            messages.append({"role": role, "content": _content(item.get("content"))})
        elif kind in ("function_call", "custom_tool_call"):
            arguments = item.get("arguments") if kind == "function_call" else json.dumps(
                {"input": item.get("input") if isinstance(item.get("input"), str) else ""})
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": arguments or "{}"}}
            last = messages[-1] if messages else None
            if last is not None and last.get("role") == "assistant" and last.get("tool_calls") is not None:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            # Codex sends an output as text or as a list of content parts: flattened to text
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": output if isinstance(output, str) else content_text(output, TEXT_KINDS)})
        # reasoning items (encrypted_content), item references and hosted tools' calls carry
        # nothing a chat template reads: dropped, and their ids are never looked up
    return messages


def _custom_function(tool: dict[str, Any]) -> dict[str, Any]:
    """A custom tool (free-form text input, e.g. Codex's apply_patch) as a function taking one
    string: its grammar, if any, is the engine's to follow from the description."""
    fn: dict[str, Any] = {"name": tool["name"], "parameters": {
        "type": "object", "properties": {"input": {"type": "string", "description": "The tool's input, verbatim"}},
        "required": ["input"]}}
    if isinstance(tool.get("description"), str):
        fn["description"] = tool["description"]
    return fn


def _tools(tools: Any) -> list[dict[str, Any]]:
    out = []
    for tool in tools if isinstance(tools, list) else []:
        # hosted tools (web search, file search, namespaces, computer use) have nothing to call here
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            continue
        if tool.get("type") == "function":
            fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
            out.append({"type": "function", "function": fn})
        elif tool.get("type") == "custom":
            out.append({"type": "function", "function": _custom_function(tool)})
    return out


def custom_tool_names(tools: Any) -> frozenset[str]:
    """The names of the request's custom tools: a call to one goes back as ``custom_tool_call``."""
    return frozenset(t["name"] for t in tools if isinstance(t, dict) and t.get("type") == "custom"
                     and isinstance(t.get("name"), str)) if isinstance(tools, list) else frozenset()


def chat_request(body: dict[str, Any], stream: bool) -> dict[str, Any]:
    """A Responses body as a chat-completions body."""
    out: dict[str, Any] = {"model": body.get("model"), "stream": stream,
                           "messages": chat_messages(body.get("instructions"), body.get("input"))}
    for ours, theirs in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                         ("parallel_tool_calls", "parallel_tool_calls")):
        if body.get(ours) is not None:
            out[theirs] = body[ours]
    tools = _tools(body.get("tools"))
    if tools:
        out["tools"] = tools
        choice = body.get("tool_choice")
        if choice in ("auto", "none", "required"):
            out["tool_choice"] = choice
        elif isinstance(choice, dict) and choice.get("type") in ("function", "custom") \
                and isinstance(choice.get("name"), str):
            out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        out["response_format"] = {"type": "json_schema", "json_schema": {
            k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        out["response_format"] = {"type": "json_object"}
    if stream:
        out["stream_options"] = {"include_usage": True}
    return out


class ResponsesToChat(StreamClosing):
    """One translated Responses exchange: built from the request, then fed the answer."""

    upstream_dialect = OPENAI
    stream_content_type = b"text/event-stream"
    upstream_route = "/v1/chat/completions"

    def __init__(self, route: str, body: dict[str, Any], stream: bool):
        self.request = body
        self.upstream_body = chat_request(body, stream)
        self.id = f"resp_{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self._reader = ChatStreamReader()
        self._seq = 0
        self._started = False
        self._output: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the output item being streamed
        self._call_items: dict[int, dict[str, Any]] = {}
        self._custom = custom_tool_names(body.get("tools"))
        super().__init__()

    def _response(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
        body = self.request
        prompt, completion = usage_tokens(usage or {})
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "model": body.get("model"), "output": output, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.get("instructions"), "previous_response_id": None,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [], "store": False, "metadata": body.get("metadata") or {},
            "temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "text": body.get("text") or {"format": {"type": "text"}},
            "usage": None if usage is None else {
                "input_tokens": prompt or 0, "output_tokens": completion or 0,
                "total_tokens": (prompt or 0) + (completion or 0),
                "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}},
        }

    @staticmethod
    def _status(finish: str | None) -> str:
        if finish is None:
            return "in_progress"  # the engine never finished: the answer says so
        return "incomplete" if finish == "length" else "completed"

    # -- whole answers -----------------------------------------------------------
    def whole(self, status: int, raw: bytes) -> bytes:
        body, error = read_whole(status, raw)
        if body is None:
            return json.dumps(openai_error(*error)).encode() if error else b""
        answer = read_answer(body)
        output: list[dict[str, Any]] = []
        if answer.text or not answer.calls:
            output.append(self._message_item(answer.text, "completed"))
        for i, c in enumerate(answer.calls):
            item = self._call_item(c.call_id or f"call_{i}", c.name or "", c.arguments, "completed")
            output.append(self._custom_done(item) if item["type"] == "custom_tool_call" else item)
        return json.dumps(self._response(self._status(answer.finish), output, answer.usage)).encode()

    @staticmethod
    def _message_item(text: str, status: str) -> dict[str, Any]:
        return {"type": "message", "id": f"msg_{uuid.uuid4().hex[:24]}", "role": "assistant", "status": status,
                "content": [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []}

    def _call_item(self, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
        if name in self._custom:  # the arguments are collected, and read once the call is whole
            return {"type": "custom_tool_call", "id": f"ctc_{call_id}", "call_id": call_id, "name": name,
                    "input": "", "status": status, "_arguments": arguments}
        return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name,
                "arguments": arguments, "status": status}

    @staticmethod
    def _custom_done(item: dict[str, Any]) -> dict[str, Any]:
        """A custom tool call made whole: its ``input`` is the function's one string argument
        (the engine's text itself when that is not the JSON asked for)."""
        raw = item.pop("_arguments", "")
        value = parse_arguments(raw)
        item.update(input=value["input"] if isinstance(value.get("input"), str) else raw, status="completed")
        return item

    # -- streams -----------------------------------------------------------------
    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return _sse(payload)

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        for event in self._reader.events(chunk):
            if not self._started:
                self._started = True
                shell = self._response("in_progress", [], None)
                yield self._event("response.created", response=shell)
                yield self._event("response.in_progress", response=shell)
            if event.text is not None:
                if self._open is None or self._open["type"] != "message":
                    yield from self._close()
                    self._open = self._message_item("", "in_progress")
                    self._open["_text"] = ""
                    yield self._event("response.output_item.added", output_index=len(self._output),
                                      item=self._public(self._open))
                    yield self._event("response.content_part.added", item_id=self._open["id"],
                                      output_index=len(self._output), content_index=0,
                                      part={"type": "output_text", "text": "", "annotations": []})
                self._open["_text"] += event.text
                yield self._event("response.output_text.delta", item_id=self._open["id"],
                                  output_index=len(self._output), content_index=0, delta=event.text, logprobs=[])
            elif event.tool is not None:
                piece = event.tool
                item = self._call_items.get(piece.index)
                if item is None:
                    yield from self._close()
                    call_id = piece.call_id or f"call_{uuid.uuid4().hex[:24]}"
                    item = self._open = self._call_items[piece.index] = self._call_item(
                        call_id, piece.name or "", "", "in_progress")
                    yield self._event("response.output_item.added", output_index=len(self._output),
                                      item=self._public(item))
                if piece.arguments and item["type"] == "custom_tool_call":
                    item["_arguments"] += piece.arguments  # its input is sent whole, at the end
                elif piece.arguments:
                    item["arguments"] += piece.arguments
                    index = len(self._output) if item is self._open else self._position(item)
                    yield self._event("response.function_call_arguments.delta", item_id=item["id"],
                                      output_index=index, delta=piece.arguments)
            elif self.noted(event):
                pass
            elif event.error is not None:
                yield self._event("error", code="server_error", message=event.error, param=None)
            elif event.done:
                yield from self.end()

    def end(self) -> Iterator[bytes]:
        """The engine's stream ended: ``response.completed`` only if it finished."""
        if not self.closing():
            return
        yield from self._close()
        status = self._status(self._finish)
        final = self._response(status, self._output, self._usage)
        yield self._event("response.completed" if status == "completed" else "response.incomplete", response=final)

    def _position(self, item: dict[str, Any]) -> int:
        return next(i for i, done in enumerate(self._output) if done["id"] == item["id"])

    @staticmethod
    def _public(item: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in item.items() if not k.startswith("_")}

    def _close(self) -> Iterator[bytes]:
        item, self._open = self._open, None
        if item is None:
            return
        index = len(self._output)
        if item["type"] == "message":
            text = item.pop("_text")
            part = {"type": "output_text", "text": text, "annotations": []}
            yield self._event("response.output_text.done", item_id=item["id"], output_index=index,
                              content_index=0, text=text, logprobs=[])
            yield self._event("response.content_part.done", item_id=item["id"], output_index=index,
                              content_index=0, part=part)
            item.update(status="completed", content=[part])
        elif item["type"] == "custom_tool_call":
            self._custom_done(item)
            yield self._event("response.custom_tool_call_input.delta", item_id=item["id"], output_index=index,
                              delta=item["input"])
            yield self._event("response.custom_tool_call_input.done", item_id=item["id"], output_index=index,
                              input=item["input"])
        else:
            yield self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                              name=item["name"], arguments=item["arguments"])
            item["status"] = "completed"
        self._output.append(item)
        yield self._event("response.output_item.done", output_index=index, item=self._public(item))
