"""Native (NDJSON) requests served by an engine that speaks only the OpenAI dialect.

An Ollama-style client asking for a model that only an OpenAI-compatible engine holds
is translated both ways: the request into the OpenAI shape, the answer back into NDJSON,
streamed and not. What does not survive is listed in docs/translation.md. A translated
stream gets its closing ``"done": true`` frame only when the engine really finished
(``finish_reason`` or ``[DONE]``): a cut stream must stay visibly cut.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any, Protocol

from hubpool_core.engine import NATIVE, OPENAI, error_message

#: native option -> OpenAI field
_OPTION_MAP = {
    "temperature": "temperature",
    "top_p": "top_p",
    "num_predict": "max_tokens",
    "stop": "stop",
    "seed": "seed",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _sampling(body: dict[str, Any], out: dict[str, Any]) -> None:
    options = body.get("options")
    if isinstance(options, dict):
        for native, openai in _OPTION_MAP.items():
            if native in options and options[native] is not None:
                out[openai] = options[native]
    if body.get("format") == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(body.get("format"), dict):
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": body["format"]}}


def _messages(messages: Any) -> Any:
    if not isinstance(messages, list):
        return messages  # let the engine refuse it in its own words
    out = []
    for msg in messages:
        if not isinstance(msg, dict):
            out.append(msg)
            continue
        m = {k: v for k, v in msg.items() if k in ("role", "content", "tool_calls", "name", "tool_call_id")}
        calls = m.get("tool_calls")
        if isinstance(calls, list):
            m["tool_calls"] = [_tool_call_to_openai(i, c) for i, c in enumerate(calls)]
        out.append(m)
    return out


def _tool_call_to_openai(index: int, call: Any) -> Any:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return call
    fn = call["function"]
    args = fn.get("arguments")
    return {
        "id": call.get("id") or f"call_{index}",
        "type": "function",
        "function": {"name": fn.get("name"), "arguments": args if isinstance(args, str) else json.dumps(args or {})},
    }


def _tool_calls_to_native(calls: Any) -> list[dict[str, Any]] | None:
    if not isinstance(calls, list) or not calls:
        return None
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            continue
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args else {}
            except (ValueError, RecursionError):
                args = {"arguments": args}
        out.append({"function": {"name": fn.get("name"), "arguments": args}})
    return out or None


class Translator(Protocol):
    """One exchange an engine serves in another dialect than the app's.

    The relay sends ``upstream_body`` to ``upstream_route`` in ``upstream_dialect``, judges
    the engine's own answer in that dialect (output checks, withholding, throughput samples
    all read the upstream bytes), and sends the app only what ``whole``, ``feed`` and ``end``
    write. A translator therefore never needs to be judged itself: a cut or degenerate
    answer is seen before it is translated, whatever the app's dialect."""

    #: the dialect the engine answers in, which the output judge reads
    upstream_dialect: str
    upstream_route: str
    upstream_body: dict[str, Any]
    #: the Content-Type of a translated stream as the app receives it
    stream_content_type: bytes

    def whole(self, status: int, raw: bytes) -> bytes:
        """A complete (non-streamed, or error) answer, in the app's dialect."""
        ...

    def feed(self, chunk: bytes) -> Iterable[bytes]:
        """Upstream stream bytes in; the app's stream bytes out (maybe none yet)."""
        ...

    def end(self) -> Iterable[bytes]:
        """The upstream stream ended: what the app's stream still needs (nothing when cut)."""
        ...


def translator_for(route: str, dialect: str, body: dict[str, Any], stream: bool,
                   engine_dialects: Iterable[str]) -> Translator | None:
    """The translator an engine speaking ``engine_dialects`` needs for this request, or None
    when it speaks the request's own dialect."""
    dialects = frozenset(engine_dialects)
    if dialect in dialects:
        return None
    if dialect == NATIVE and OPENAI in dialects:
        return NativeToOpenAI(route, body, stream)
    raise ValueError(f"no translation from {dialect} to {', '.join(sorted(dialects))}")


def judged_dialect(dialect: str, translator: Translator | None) -> str:
    """The dialect the output judge reads: the engine's own, never what the app is sent."""
    return translator.upstream_dialect if translator is not None else dialect


class NativeToOpenAI:
    """One translated exchange: built from the native request, then fed the answer."""

    upstream_dialect = OPENAI
    stream_content_type = b"application/x-ndjson"

    def __init__(self, route: str, body: dict[str, Any], stream: bool):
        self.route = route
        self.model = body.get("model")
        self.stream = stream
        self.started = time.monotonic()
        self.upstream_route, self.upstream_body = self._request(route, body, stream)
        self._usage: dict[str, Any] | None = None
        self._finish: str | None = None
        self._tool_calls: dict[int, dict[str, Any]] = {}
        self._buffer = b""
        self._done_sent = False

    # -- request -----------------------------------------------------------------
    def _request(self, route: str, body: dict[str, Any], stream: bool) -> tuple[str, dict[str, Any]]:
        model = body.get("model")
        if route == "/api/chat":
            out: dict[str, Any] = {"model": model, "messages": _messages(body.get("messages")), "stream": stream}
            if body.get("tools"):
                out["tools"] = body["tools"]
            _sampling(body, out)
            if stream:
                out["stream_options"] = {"include_usage": True}
            return "/v1/chat/completions", out
        if route == "/api/generate":
            if body.get("raw"):
                out = {"model": model, "prompt": body.get("prompt", ""), "stream": stream}
                _sampling(body, out)
                return "/v1/completions", out
            messages = []
            if isinstance(body.get("system"), str) and body["system"]:
                messages.append({"role": "system", "content": body["system"]})
            messages.append({"role": "user", "content": body.get("prompt", "")})
            out = {"model": model, "messages": messages, "stream": stream}
            _sampling(body, out)
            if stream:
                out["stream_options"] = {"include_usage": True}
            return "/v1/chat/completions", out
        if route == "/api/embed":
            return "/v1/embeddings", {"model": model, "input": body.get("input", "")}
        if route == "/api/embeddings":
            return "/v1/embeddings", {"model": model, "input": body.get("prompt", "")}
        raise ValueError(f"no translation for {route}")

    # -- whole answers -----------------------------------------------------------
    def whole(self, status: int, raw: bytes) -> bytes:
        """Translate a complete (non-streamed, or error) answer."""
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            body = None
        if status >= 400 or not isinstance(body, dict):
            message = error_message(body) if isinstance(body, dict) else None
            return json.dumps({"error": message or raw.decode("utf-8", "replace")[:2000]}).encode()
        if self.route in ("/api/embed", "/api/embeddings"):
            vectors = [d.get("embedding") for d in body.get("data", []) if isinstance(d, dict)]
            if self.route == "/api/embeddings":
                return json.dumps({"embedding": vectors[0] if vectors else []}).encode()
            usage = body.get("usage") or {}
            return json.dumps({
                "model": self.model, "embeddings": vectors,
                "total_duration": self._elapsed_ns(), "prompt_eval_count": usage.get("prompt_tokens"),
            }).encode()
        choice = (body.get("choices") or [{}])[0]
        usage = body.get("usage") or {}
        if "message" in choice:
            msg = choice.get("message") or {}
            text = msg.get("content") or ""
            calls = _tool_calls_to_native(msg.get("tool_calls"))
        else:
            text, calls = choice.get("text") or "", None
        frame = self._frame(text, calls)
        finish = choice.get("finish_reason")
        # done mirrors the engine: no finish_reason means the answer was cut
        frame.update(self._final_fields(finish, usage) if finish else {"done": False})
        return json.dumps(frame).encode()

    # -- streams -----------------------------------------------------------------
    def feed(self, chunk: bytes) -> Iterator[bytes]:
        """Feed raw SSE bytes; yields NDJSON lines (each ending in a newline)."""
        self._buffer += chunk
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                if self._finish is not None and not self._done_sent:
                    yield self._final_line()
                continue
            try:
                obj = json.loads(data)
            except (ValueError, RecursionError):
                continue
            if not isinstance(obj, dict):
                continue
            if "error" in obj:
                yield json.dumps({"error": error_message(obj) or "engine error"}).encode() + b"\n"
                continue
            if isinstance(obj.get("usage"), dict):
                self._usage = obj["usage"]
            for choice in obj.get("choices") or []:
                if not isinstance(choice, dict):
                    continue
                # the engine's JSON is read, not trusted: a field of the wrong type is skipped,
                # never an exception that cuts the client's stream
                delta = d if isinstance(d := choice.get("delta"), dict) else {}
                text = delta.get("content") if "delta" in choice else choice.get("text")
                calls = delta.get("tool_calls")
                for call in calls if isinstance(calls, list) else []:
                    if isinstance(call, dict):
                        self._merge_tool_call(call)
                if isinstance(text, str) and text:
                    yield json.dumps(self._frame(text, None) | {"done": False}).encode() + b"\n"
                if choice.get("finish_reason"):
                    self._finish = choice["finish_reason"]

    def end(self) -> Iterator[bytes]:
        """The upstream stream ended; close the NDJSON stream only if the engine finished."""
        if self._finish is not None and not self._done_sent:
            yield self._final_line()

    def _merge_tool_call(self, call: dict[str, Any]) -> None:
        index = call.get("index", 0)
        if not isinstance(index, int) or isinstance(index, bool):
            index = 0
        slot = self._tool_calls.setdefault(index, {"function": {"name": None, "arguments": ""}})
        fn = f if isinstance(f := call.get("function"), dict) else {}
        if isinstance(fn.get("name"), str) and fn["name"]:
            slot["function"]["name"] = fn["name"]
        if isinstance(fn.get("arguments"), str) and fn["arguments"]:
            slot["function"]["arguments"] += fn["arguments"]

    def _final_line(self) -> bytes:
        self._done_sent = True
        calls = _tool_calls_to_native(list(self._tool_calls.values())) if self._tool_calls else None
        frame = self._frame("", calls) | self._final_fields(self._finish, self._usage or {})
        return json.dumps(frame).encode() + b"\n"

    def _frame(self, text: str, calls: list[dict[str, Any]] | None) -> dict[str, Any]:
        frame: dict[str, Any] = {"model": self.model, "created_at": _now()}
        if self.route == "/api/chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                message["tool_calls"] = calls
            frame["message"] = message
        else:
            frame["response"] = text
        return frame

    def _final_fields(self, finish: str | None, usage: dict[str, Any]) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "done": True,
            "done_reason": "length" if finish == "length" else "stop",
            "total_duration": self._elapsed_ns(),
        }
        if isinstance(usage.get("prompt_tokens"), int):
            fields["prompt_eval_count"] = usage["prompt_tokens"]
        if isinstance(usage.get("completion_tokens"), int):
            fields["eval_count"] = usage["completion_tokens"]
        return fields

    def _elapsed_ns(self) -> int:
        return int((time.monotonic() - self.started) * 1e9)
