"""The relay: walk the ranked candidates, commit to the first good answer, pass its bytes.

This is the hot path. Upstream calls use the node's one aiohttp ClientSession (httpx cost
3–9 ms CPU per request here and collapsed at 64 streams — shared/perf-baseline.md). The
response is a raw ASGI callable so it can race the upstream wait against the client's
disconnect: a client that hangs up before headers aborts the upstream request too, and
the turn is never placed on another candidate.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from starlette.responses import Response

from hubpool_core.engine import OPENAI
from hubpool_core.local_engines import LocalBackend
from hubpool_core.proxy.translate import NativeToOpenAI

log = logging.getLogger("hubpool.relay")

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "upgrade",
     "proxy-authenticate", "proxy-authorization", "te", "trailer", "date", "server"}
)
STREAM_TYPES = ("application/x-ndjson", "text/event-stream")
#: local candidates fail over on these besides 5xx (the engine talking about its queue)
LOCAL_FAILOVER_4XX = frozenset({408, 429})


class ClientGone(Exception):
    """The app closed its connection."""


@dataclass
class Budgets:
    connect_ms: int
    completion_ms: int
    min_prefill_tps: int

    def first_byte_ms(self, estimated_tokens: int) -> int:
        return max(self.connect_ms, math.ceil(estimated_tokens / self.min_prefill_tps) * 1000)

    def forward_ms(self, estimated_tokens: int, stream: bool) -> int:
        first = self.first_byte_ms(estimated_tokens)
        return first if stream else max(self.completion_ms, first)


@dataclass
class RelayPlan:
    route: str
    dialect: str
    body: dict[str, Any]
    raw: bytes
    model: str
    stream: bool
    candidates: list[LocalBackend]
    row: dict[str, Any]
    budget_ms: int
    extra_headers: dict[str, str] = field(default_factory=dict)


def _attribution(plan: RelayPlan, backend: LocalBackend) -> list[tuple[bytes, bytes]]:
    return [
        (b"x-hub-pool-served-by", b"local"),
        (b"x-hub-pool-backend", backend.engine.kind.encode()),
        (b"x-hub-pool-model", plan.model.encode("utf-8", "replace")),
        (b"x-hub-pool-request-id", plan.row["id"].encode()),
    ]


def _pass_headers(upstream: aiohttp.ClientResponse) -> list[tuple[bytes, bytes]]:
    out = []
    for key, value in upstream.raw_headers:
        lk = key.lower()
        if lk.decode("latin-1") in HOP_BY_HOP or lk.startswith(b"x-hub-pool-"):
            continue  # attribution is always this node's own statement
        out.append((lk, value))
    return out


class RelayResponse(Response):
    """ASGI response that performs the walk for one planned request. It subclasses
    Response only so the framework hands it the raw send/receive; it builds no body."""

    def __init__(self, node: Any, plan: RelayPlan):  # noqa: D107 - Response.__init__ deliberately not called
        self.node = node
        self.plan = plan
        self.background = None
        self.status_code = 200

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        gone = asyncio.Event()

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    gone.set()
                    return

        watcher = asyncio.ensure_future(watch())
        self.node.in_flight += 1
        started = time.monotonic()
        try:
            await self._walk(send, gone, started)
        finally:
            self.node.in_flight -= 1
            watcher.cancel()
            row = self.plan.row
            if row["totalMs"] is None:
                row["totalMs"] = int((time.monotonic() - started) * 1000)
            if row["outcome"] == "pending":
                self.node.routing_log.touch(row, outcome="failed", reason=row["reason"] or "ended without an answer")
            self.node.plugins.broadcast_request_finished(row)

    async def _walk(self, send: Any, gone: asyncio.Event, started: float) -> None:
        plan, log_ = self.plan, self.node.routing_log
        row = plan.row
        total = len(plan.candidates)
        last_error = "no candidate answered"
        for attempt, backend in enumerate(plan.candidates, start=1):
            engine = backend.engine
            translator = None
            route, body_bytes = plan.route, plan.raw
            if plan.dialect not in engine.dialects:
                translator = NativeToOpenAI(plan.route, plan.body, plan.stream)
                route, body_bytes = translator.upstream_route, json.dumps(translator.upstream_body).encode()
            dialect = OPENAI if translator else plan.dialect
            url = engine.base_url + engine.upstream_path(dialect, route)
            headers = {"Content-Type": "application/json", **engine.auth_headers(), **plan.extra_headers}
            log_.touch(row, node="local", backend=engine.kind, attempt=attempt)
            request = self.node.session.post(
                url, data=body_bytes, headers=headers, skip_auto_headers=("Accept-Encoding",)
            )
            try:
                upstream = await _race(request, gone, plan.budget_ms / 1000)
            except ClientGone:
                waited = int((time.monotonic() - started) * 1000)
                log_.touch(row, outcome="failed", status=None, clientClosed=True, durationMs=waited,
                           reason=f"the app closed its connection after {waited} ms; local had not answered yet")
                return
            except asyncio.TimeoutError:
                last_error = f"No response headers within {plan.budget_ms}ms"
                self._passed_over(backend, None, last_error)
                continue
            except aiohttp.ClientError as exc:
                last_error = f"fetch failed ({_transport_code(exc)})"
                self._passed_over(backend, None, last_error)
                continue
            status = upstream.status
            if status >= 500 or status in LOCAL_FAILOVER_4XX:
                last_error = f"HTTP {status}"
                upstream.release()
                if attempt < total:
                    self._passed_over(backend, status, last_error)
                    self.node.local.invalidate(engine)
                    continue
                # last candidate: its answer goes back as the engine gave it
            await self._commit(send, gone, upstream, backend, translator, started)
            return
        log_.touch(row, outcome="failed", status=502, durationMs=int((time.monotonic() - started) * 1000),
                   reason=last_error)
        body = json.dumps({"error": f'All {total} pool candidates for model "{plan.model}" failed: {last_error}'}).encode()
        await send({"type": "http.response.start", "status": 502,
                    "headers": [(b"content-type", b"application/json"),
                                (b"x-hub-pool-request-id", row["id"].encode())]})
        await send({"type": "http.response.body", "body": body})

    def _passed_over(self, backend: LocalBackend, status: int | None, reason: str) -> None:
        row = self.plan.row
        row["failedOverFrom"].append("local")
        row["attempts"].append({"node": "local", "backend": backend.engine.kind, "status": status, "reason": reason[:200]})
        log.warning("failover: local %s passed over for %s (%s)", backend.engine.kind, self.plan.model, reason)

    async def _commit(self, send: Any, gone: asyncio.Event, upstream: aiohttp.ClientResponse,
                      backend: LocalBackend, translator: NativeToOpenAI | None, started: float) -> None:
        plan, row, log_ = self.plan, self.plan.row, self.node.routing_log
        status = upstream.status
        ctype = upstream.headers.get("Content-Type", "")
        streamed = any(t in ctype for t in STREAM_TYPES)
        duration = int((time.monotonic() - started) * 1000)
        outcome = "served" if status < 400 else "failed"
        fields: dict[str, Any] = {"status": status, "durationMs": duration, "outcome": outcome}
        if 400 <= status < 500:
            fields["requestError"] = {"signature": "client-error", "basis": "status", "confirms": None}
            fields["reason"] = f"HTTP {status}"
        elif status >= 500:
            fields["reason"] = f"HTTP {status}"
        log_.touch(row, **fields)
        headers = _attribution(plan, backend)
        try:
            if translator is not None:
                await self._relay_translated(send, gone, upstream, translator, streamed, headers)
            else:
                headers = _pass_headers(upstream) + headers
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await self._pump(send, gone, upstream, lambda chunk: (chunk,))
        finally:
            upstream.release() if upstream.content.at_eof() else upstream.close()
        row["totalMs"] = int((time.monotonic() - started) * 1000)
        log_.touch(row)

    async def _relay_translated(self, send: Any, gone: asyncio.Event, upstream: aiohttp.ClientResponse,
                                translator: NativeToOpenAI, streamed: bool,
                                headers: list[tuple[bytes, bytes]]) -> None:
        status = upstream.status
        if not streamed or status >= 400:
            raw = await _race(upstream.read(), gone, None)
            body = translator.whole(status, raw)
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"application/json")] + headers})
            await send({"type": "http.response.body", "body": body})
            return
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/x-ndjson")] + headers})
        await self._pump(send, gone, upstream, translator.feed, tail=translator.end)

    async def _pump(self, send: Any, gone: asyncio.Event, upstream: aiohttp.ClientResponse,
                    convert: Any, tail: Any = None) -> None:
        """Pass chunks as they arrive; stop (closing upstream) when the app hangs up."""
        row, log_ = self.plan.row, self.node.routing_log
        reader = upstream.content
        try:
            while True:
                chunk = await _race(reader.readany(), gone, None)
                if not chunk:
                    break
                for out in convert(chunk):
                    await send({"type": "http.response.body", "body": out, "more_body": True})
            if tail is not None:
                for out in tail():
                    await send({"type": "http.response.body", "body": out, "more_body": True})
        except ClientGone:
            log_.touch(row, clientClosed=True, outcome="failed", reason="the app closed its connection mid-response")
            return
        except (aiohttp.ClientError, asyncio.IncompleteReadError) as exc:
            # committed: no failover, the stream is left to die visibly (spec: Failover)
            log_.touch(row, outcome="failed", reason=f"truncated-upstream ({_transport_code(exc)})",
                       requestError={"signature": "truncated-upstream", "basis": "node", "confirms": None})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _race(awaitable: Any, gone: asyncio.Event, timeout: float | None) -> Any:
    """Await ``awaitable`` unless the client goes away first (then cancel it: the upstream
    socket closes, which is how the engine learns to stop)."""
    task = asyncio.ensure_future(awaitable)
    waiter = asyncio.ensure_future(gone.wait())
    try:
        done, _ = await asyncio.wait({task, waiter}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        waiter.cancel()
        raise
    if task in done:
        waiter.cancel()
        return task.result()
    task.cancel()
    waiter.cancel()
    try:
        await task
    except BaseException:  # noqa: BLE001 - the cancelled request's outcome is irrelevant now
        pass
    if waiter in done:
        raise ClientGone()
    raise asyncio.TimeoutError()


def _transport_code(exc: BaseException) -> str:
    cause = exc
    while cause is not None:
        errno = getattr(cause, "errno", None)
        if errno == 111:
            return "ECONNREFUSED"
        if errno == 104:
            return "ECONNRESET"
        cause = cause.__cause__ or getattr(cause, "os_error", None)
        if cause is exc:
            break
    return type(exc).__name__
