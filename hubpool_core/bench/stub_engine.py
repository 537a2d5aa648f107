"""A minimal, fast OpenAI-style engine for the relay benchmark.

A raw asyncio protocol (uvloop when installed) rather than a framework, so the stub costs
as little CPU as possible and the relay under test dominates what is measured. Every
answer is deterministic (fixed ids and timestamps) so two answers to the same request are
byte-identical, which is what the byte-transparency check compares.

Routes: ``GET /v1/models``, ``/api/tags``, ``/api/ps``, ``/api/version``, ``/health``,
``/props`` (the listings every engine's probe reads), ``POST /v1/chat/completions`` (JSON, or SSE when
``"stream": true``), ``POST /v1/messages`` (Anthropic's Messages: JSON, or its event stream)
and ``POST /api/chat`` (NDJSON unless ``"stream": false``). ``--version`` is what
``/api/version`` says: from 0.14.0 an Ollama plugin in front of it sends ``/v1/messages``
through untranslated (the relay benchmark's native Messages figures), below it translates.

Models: ``bench-fast`` answers at once; ``bench-paced`` waits ``--pace-ms`` before each
token (and the whole of it before a non-streamed answer). ``max_tokens`` (OpenAI) or
``options.num_predict`` (native) sets the token count, else ``--tokens``.

Run: ``python -m hubpool_core.bench.stub_engine --port 9001``
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

FAST = "bench-fast"
PACED = "bench-paced"
MODELS = (FAST, PACED)
CREATED = 1_700_000_000
STAMP = "2026-01-01T00:00:00Z"
WORD = "tok "
#: the owner the listing names: one no engine claims, so any engine's probe accepts it
OWNER = "bench"


def _listing(path: str, version: str = "0.0.0-bench") -> bytes | None:
    if path == "/v1/models":
        return json.dumps({"object": "list", "data": [
            {"id": m, "object": "model", "created": CREATED, "owned_by": OWNER} for m in MODELS]}).encode()
    if path in ("/api/tags", "/api/ps"):
        return json.dumps({"models": [
            {"name": m, "model": m, "modified_at": STAMP, "size": 1, "digest": "0" * 12, "details": {},
             "context_length": 8192, "size_vram": 1} for m in MODELS]}).encode()
    if path == "/api/version":
        return json.dumps({"version": version}).encode()
    if path == "/health":
        return b'{"status":"ok"}'
    if path == "/props":  # the window and slot count an engine that states its slots reads, and
        # the model file llama-server names beside them (its probe reuses a listing while it holds)
        return json.dumps({"default_generation_settings": {"n_ctx": 8192}, "total_slots": 64,
                           "model_path": f"/models/{MODELS[0]}", "build_info": "bench-stub"}).encode()
    return None


def sse_frames(model: str, tokens: int) -> list[bytes]:
    """The SSE events of one streamed answer, each a whole ``data: ...\\n\\n`` event."""
    frames = []
    for i in range(tokens):
        delta = {"role": "assistant", "content": WORD} if i == 0 else {"content": WORD}
        frames.append(_chunk(model, delta, None))
    frames.append(_chunk(model, {}, "stop"))
    frames.append(b"data: [DONE]\n\n")
    return frames


def _chunk(model: str, delta: dict[str, Any], finish: str | None) -> bytes:
    obj = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": CREATED, "model": model,
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def messages_frames(model: str, tokens: int) -> list[bytes]:
    """The events of one streamed Messages answer (message_start ... message_stop)."""
    def event(name: str, payload: dict[str, Any]) -> bytes:
        return f"event: {name}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()

    start: dict[str, Any] = {"id": "msg_bench", "type": "message", "role": "assistant", "model": model, "content": [],
             "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 8, "output_tokens": 0}}
    delta = event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                          "delta": {"type": "text_delta", "text": WORD}})
    return [event("message_start", {"type": "message_start", "message": start}),
            event("content_block_start", {"type": "content_block_start", "index": 0,
                                          "content_block": {"type": "text", "text": ""}}),
            *[delta] * tokens,
            event("content_block_stop", {"type": "content_block_stop", "index": 0}),
            event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn",
                                                                       "stop_sequence": None},
                                    "usage": {"output_tokens": tokens}}),
            event("message_stop", {"type": "message_stop"})]


def messages_body(model: str, tokens: int) -> bytes:
    """A non-streamed Messages answer."""
    return json.dumps({"id": "msg_bench", "type": "message", "role": "assistant", "model": model,
                       "content": [{"type": "text", "text": WORD * tokens}], "stop_reason": "end_turn",
                       "stop_sequence": None, "usage": {"input_tokens": 8, "output_tokens": tokens}},
                      separators=(",", ":")).encode()


def ndjson_frames(model: str, tokens: int) -> list[bytes]:
    """The NDJSON lines of one streamed native answer."""
    line = json.dumps({"model": model, "created_at": STAMP, "message": {"role": "assistant", "content": WORD},
                       "done": False}, separators=(",", ":")).encode() + b"\n"
    last = json.dumps({"model": model, "created_at": STAMP, "message": {"role": "assistant", "content": ""},
                       "done": True, "done_reason": "stop", "eval_count": tokens}, separators=(",", ":")).encode()
    return [line] * tokens + [last + b"\n"]


def whole_body(model: str, tokens: int, native: bool) -> bytes:
    """A non-streamed answer."""
    text = WORD * tokens
    if native:
        obj: dict[str, Any] = {"model": model, "created_at": STAMP, "message": {"role": "assistant", "content": text},
                               "done": True, "done_reason": "stop", "eval_count": tokens}
    else:
        obj = {"id": "chatcmpl-bench", "object": "chat.completion", "created": CREATED, "model": model,
               "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": 8 + tokens}}
    return json.dumps(obj, separators=(",", ":")).encode()


class StubProtocol(asyncio.Protocol):
    """One HTTP/1.1 keep-alive connection; requests on it are served one at a time."""

    def __init__(self, pace_s: float, tokens: int, version: str = "0.0.0-bench"):
        self.pace_s, self.tokens, self.version = pace_s, tokens, version
        self.buf = bytearray()
        self.transport: Any = None
        self.busy = False
        self.closed = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self._next()

    def _next(self) -> None:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        try:
            method, target, _ = head[0].split(" ", 2)
        except ValueError:
            self.transport.close()
            return
        length, keep = 0, True
        for line in head[1:]:
            key, _, value = line.partition(":")
            key = key.strip().lower()
            if key == "content-length":
                length = int(value.strip() or 0)
            elif key == "connection" and value.strip().lower() == "close":
                keep = False
            elif key == "transfer-encoding":
                # every client of the bench sends a length; a chunked body is not worth parsing here
                self.transport.write(b"HTTP/1.1 411 Length Required\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                self.transport.close()
                return
        total = end + 4 + length
        if len(self.buf) < total:
            return
        body = bytes(self.buf[end + 4:total])
        del self.buf[:total]
        self.busy = True
        asyncio.ensure_future(self._serve(method, target.split("?", 1)[0], body, keep))

    async def _serve(self, method: str, path: str, body: bytes, keep: bool) -> None:
        try:
            await self._answer(method, path, body, keep)
        finally:
            self.busy = False
            if not keep:
                self.transport.close()
            elif self.buf and not self.closed:
                self._next()

    def _simple(self, status: str, payload: bytes, keep: bool, ctype: str = "application/json") -> None:
        self.transport.write(
            f"HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {len(payload)}\r\n"
            f"connection: {'keep-alive' if keep else 'close'}\r\n\r\n".encode() + payload)

    async def _answer(self, method: str, path: str, body: bytes, keep: bool) -> None:
        if method == "GET":
            listing = _listing(path, self.version)
            if listing is None:
                self._simple("404 Not Found", b'{"error":"not found"}', keep)
            else:
                self._simple("200 OK", listing, keep)
            return
        if method != "POST" or path not in ("/v1/chat/completions", "/api/chat", "/v1/messages"):
            self._simple("404 Not Found", b'{"error":"not found"}', keep)
            return
        try:
            req = json.loads(body or b"{}")
        except ValueError:
            self._simple("400 Bad Request", b'{"error":"bad json"}', keep)
            return
        model = str(req.get("model", FAST))
        if model not in MODELS:
            self._simple("404 Not Found", json.dumps({"error": f"model {model!r} not found"}).encode(), keep)
            return
        native, messages = path == "/api/chat", path == "/v1/messages"
        limit = (req.get("options") or {}).get("num_predict") if native else req.get("max_tokens")
        tokens = limit if isinstance(limit, int) and 0 < limit <= 4096 else self.tokens
        pace = self.pace_s if model == PACED else 0.0
        stream = req.get("stream", True) is not False if native else req.get("stream") is True
        if not stream:
            if pace:
                await asyncio.sleep(pace * tokens)
            self._simple("200 OK", messages_body(model, tokens) if messages else whole_body(model, tokens, native),
                         keep)
            return
        frames = ndjson_frames(model, tokens) if native else messages_frames(model, tokens) if messages else \
            sse_frames(model, tokens)
        ctype = "application/x-ndjson" if native else "text/event-stream"
        self.transport.write(f"HTTP/1.1 200 OK\r\ncontent-type: {ctype}\r\ncache-control: no-cache\r\n"
                             f"transfer-encoding: chunked\r\nconnection: {'keep-alive' if keep else 'close'}"
                             "\r\n\r\n".encode())
        for i, frame in enumerate(frames):
            # the pace is per token: the closing frames follow the last token at once
            if pace and (i - 2 if messages else i) in range(tokens):
                await asyncio.sleep(pace)
            if self.closed:
                return  # the client hung up: stop generating, as an engine does
            self.transport.write(b"%x\r\n%s\r\n" % (len(frame), frame))
        self.transport.write(b"0\r\n\r\n")


async def serve(host: str, port: int, pace_ms: float, tokens: int, version: str = "0.0.0-bench") -> asyncio.Server:
    """Start the stub on ``host:port`` (port 0 picks one) and return the server."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: StubProtocol(pace_ms / 1000, tokens, version), host, port, backlog=2048)


def main() -> None:
    """Command line: serve until killed."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9001)
    ap.add_argument("--pace-ms", type=float, default=20.0)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--version", default="0.0.0-bench", help="what /api/version says")
    args = ap.parse_args()

    async def run() -> None:
        server = await serve(args.host, args.port, args.pace_ms, args.tokens, args.version)
        print(f"stub engine on {args.host}:{server.sockets[0].getsockname()[1]}", flush=True)
        await server.serve_forever()

    run_fast(run())


def run_fast(coro: Any) -> Any:
    """Run ``coro`` on uvloop when it is installed (as a node runs), else on asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


if __name__ == "__main__":
    main()
