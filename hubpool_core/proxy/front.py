"""The app's side of a streamed request that waits (issue 25 item 4, issue 28): keep-alives
before the first real frame, and the dialect's error event where a stream cannot end whole.

Claude Code and Codex abort a stream that is silent for 300 s, and the SDKs give up on a
request without headers after 600 s; a long prompt on a slow box is silent for longer than
either before its first token. So a streamed Messages, Responses or OpenAI request that has
no real content after ``poolStreamKeepAliveMs`` is committed to the app early — status 200,
``text/event-stream``, this node's request id and model, no serving node yet — and kept alive
every ``poolStreamKeepAliveMs`` (``event: ping`` for Messages, an SSE comment for the
others), while the walk goes on underneath and may still fail over. The walk sends what it
always sends; :class:`Front` stands between: after an early start it drops the answer's own
headers and passes its body, and turns a status the app can no longer be told (the 502 when
every candidate failed, an engine's 4xx, a verdict) into the dialect's error event, so a
stream never ends in a silent close that a client reads as a finished answer.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from starlette.types import Message, Send

from hubpool_core.engine import MESSAGES, NATIVE, OPENAI, RESPONSES, error_message
from hubpool_core.proxy.plan import RelayPlan
from hubpool_core.proxy.translate_messages import error_body as anthropic_error
from hubpool_core.proxy.translate_responses import openai_error

#: the routes whose streams are kept alive: the SSE dialects of the agents and the SDKs
KEEPALIVE_ROUTES = frozenset({"/v1/messages", "/v1/responses", "/v1/chat/completions", "/v1/completions"})
#: the shortest keep-alive cadence honoured, whatever the setting says
MIN_KEEPALIVE_MS = 100
#: how much of an error body is read into the error event (the rest is not the message)
MAX_ERROR_BODY = 64 * 1024
_MESSAGES_PING = b'event: ping\ndata: {"type": "ping"}\n\n'
_COMMENT = b": keep-alive\n\n"


def _sse(event: str | None, payload: dict[str, Any]) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


def error_event(dialect: str, status: int, message: str, *, response: dict[str, Any] | None = None,
                sequence: int | None = None, model: str | None = None) -> bytes:
    """How a stream of ``dialect`` says it failed: Anthropic's ``event: error``; Responses'
    ``response.failed`` (after a ``response.created`` when the app has seen none, so an SDK
    that accumulates the stream reads it); an OpenAI ``data: {"error": …}`` frame; an NDJSON
    ``{"error": …}`` line. ``response``: the id, model and next sequence number of a Responses
    stream already under way (``{"id", "model"}``), else None."""
    if dialect in (MESSAGES,):
        return _sse("error", anthropic_error(status, message))
    if dialect == RESPONSES:
        out = b""
        seq = sequence or 0
        if response is None:
            response = {"id": f"resp_{uuid.uuid4().hex[:24]}", "model": model}
            shell = _response_shell(response, "in_progress", None)
            out += _sse("response.created", {"type": "response.created", "sequence_number": seq, "response": shell})
            seq += 1
        failed = _response_shell(response, "failed", {"code": "server_error", "message": message})
        return out + _sse("response.failed", {"type": "response.failed", "sequence_number": seq, "response": failed})
    if dialect == NATIVE:
        return json.dumps({"error": message}).encode() + b"\n"
    return _sse(None, openai_error(status, message))


def _response_shell(response: dict[str, Any], status: str, error: dict[str, Any] | None) -> dict[str, Any]:
    return {"id": response.get("id"), "object": "response", "created_at": int(time.time()), "status": status,
            "model": response.get("model"), "output": [], "error": error, "incomplete_details": None, "usage": None}


def keepalive_eligible(plan: RelayPlan, every_ms: int) -> bool:
    """Whether this request's stream may be committed early and kept alive."""
    return (every_ms > 0 and plan.stream and plan.inbound_from is None and plan.route in KEEPALIVE_ROUTES
            and plan.dialect in (MESSAGES, RESPONSES, OPENAI))


class Front:
    """The send the walk uses for one keep-alive-eligible stream (see the module docstring).

    ``early``: the 200 went to the app before any answer did. The keep-alives run in their
    own task, started by a timer only once the first delay has passed (a stream committed
    sooner costs one timer); a lock keeps a keep-alive from interleaving with the answer."""

    def __init__(self, plan: RelayPlan, send: Send, every_ms: int, gone: asyncio.Event | None = None):
        self.plan = plan
        self.raw = send
        self.every = max(every_ms, MIN_KEEPALIVE_MS) / 1000
        self.gone = gone
        self.started = False  # a response start has gone to the app (early or the answer's own)
        self.early = False
        self.ended = False
        self.keepalives = 0
        #: after an early start, the answer's own 200 stream began: its pump ends the body
        self.answered = False
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(self.every, self._begin)
        #: after an early start: the walk's own answer is not a 200 stream, its body is collected
        self._failing: int | None = None
        self._error = b""

    # -- the keep-alives -------------------------------------------------------------------
    def _begin(self) -> None:
        self._timer = None
        if not self.started:
            self._task = asyncio.ensure_future(self._keep_alive())

    async def _keep_alive(self) -> None:
        ping = _MESSAGES_PING if self.plan.dialect == MESSAGES else _COMMENT
        while self.gone is None or not self.gone.is_set():
            async with self._lock:
                if self.ended or (self.started and not self.early):
                    return
                if not self.started:
                    await self.raw({"type": "http.response.start", "status": 200, "headers": self._early_headers()})
                    self.started = self.early = True
                    self.plan.row["keepAlive"] = True
                await self.raw({"type": "http.response.body", "body": ping, "more_body": True})
                self.keepalives += 1
            await asyncio.sleep(self.every)

    def _early_headers(self) -> list[tuple[bytes, bytes]]:
        # no X-Hub-Pool-Served-By / -Backend: no node has answered yet, and the walk may still
        # fail over; the routing log, found by the request id, names the node that did
        plan = self.plan
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
                   (b"x-hub-pool-request-id", plan.row["id"].encode()),
                   (b"x-hub-pool-model", plan.model.encode("utf-8", "replace"))]
        return headers + [(k.lower().encode(), v.encode()) for k, v in plan.context_headers().items()]

    async def stop(self) -> None:
        """No more keep-alives (the answer starts, or the request is over)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task, self._task = self._task, None
        if task is not None:
            async with self._lock:  # never while a keep-alive is half sent
                task.cancel()

    # -- the walk's sends ------------------------------------------------------------------
    async def __call__(self, message: Message) -> None:
        if self._timer is not None or self._task is not None:
            await self.stop()
        if message["type"] == "http.response.start":
            if not self.early:
                self.started = True
                await self.raw(message)
                return
            ctype = next((v for k, v in message.get("headers", ()) if k == b"content-type"), b"")
            if message["status"] != 200 or b"event-stream" not in ctype:
                self._failing = message["status"]
            else:
                self.answered = True
            return
        if self._failing is None:
            if not message.get("more_body", False):
                self.ended = True
            await self.raw(message)
            return
        if len(self._error) < MAX_ERROR_BODY:
            self._error += message.get("body", b"")[:MAX_ERROR_BODY - len(self._error)]
        if not message.get("more_body", False):
            await self._fail(self._failing, self._error)

    def for_body(self) -> Send:
        """The send for an answer's body once its start went through this: the app's own,
        unless the body is being turned into an error event."""
        return self.raw if self._failing is None else self

    async def _fail(self, status: int, body: bytes) -> None:
        try:
            parsed = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            parsed = None
        message = error_message(parsed) if parsed is not None else None
        if message is None:
            message = body.decode("utf-8", "replace")[:2000] or f"HTTP {status}"
        if status == 200:
            message = "the engine answered a streamed request with a whole body: " + message[:500]
            status = 502
        self.ended = True
        event = error_event(self.plan.dialect, status, message, model=self.plan.model)
        await self.raw({"type": "http.response.body", "body": event, "more_body": False})

    async def close(self) -> None:
        """The request is over: stop the keep-alives, and end an early stream the walk left
        open (its app hung up, or it ended without an answer)."""
        await self.stop()
        if self.early and not self.ended and not self.answered:
            self.ended = True
            gone = self.gone is not None and self.gone.is_set()
            event = b"" if gone else error_event(self.plan.dialect, 502, self.plan.row.get("reason")
                                                  or "the pool ended the stream without an answer",
                                                  model=self.plan.model)
            await self.raw({"type": "http.response.body", "body": event, "more_body": False})
