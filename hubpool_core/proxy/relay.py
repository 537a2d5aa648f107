"""The relay: walk the ranked candidates, commit to the first good answer, pass its bytes.

This is the hot path. Upstream calls use the node's one aiohttp ClientSession (httpx cost
3–9 ms CPU per request here and collapsed at 64 streams — shared/perf-baseline.md). The
response is a raw ASGI callable so it can race the upstream wait against the client's
disconnect: a client that hangs up before headers aborts the upstream request too, and
the turn is never placed on another candidate.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import math
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from starlette.responses import Response

from hubpool_core.engine import OPENAI, REQUEST_ERROR_SIGNATURES
from hubpool_core.models_ids import fold_model_id, same_model
from hubpool_core.peering.client import PeerAuthError
from hubpool_core.placement import Candidate
from hubpool_core.placement.quarantine import DROPPED
from hubpool_core.placement.throughput import MIN_PROMPT_TOKENS
from hubpool_core.proxy.output_check import (
    COMPLETION_ROUTES,
    MAX_JUDGED_BODY_BYTES,
    TRUNCATED,
    StreamJudge,
    judge_whole,
)
from hubpool_core.proxy.translate import NativeToOpenAI

log = logging.getLogger("hubpool.relay")

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "upgrade",
     "proxy-authenticate", "proxy-authorization", "te", "trailer", "date", "server"}
)
STREAM_TYPES = ("application/x-ndjson", "text/event-stream")
#: local candidates fail over on these besides 5xx (the engine talking about its queue)
LOCAL_FAILOVER_4XX = frozenset({408, 429})
LOCAL_PREFIX = "/api/inference/pool/local"


class ClientGone(Exception):
    """The app closed its connection."""


class _Send:
    """What the connector tells the relay about one upstream request, and the reverse."""

    __slots__ = ("reused", "fresh")

    def __init__(self, fresh: bool = False) -> None:
        self.reused = False
        self.fresh = fresh


#: set by the relay around one upstream request (the request's task copies it, the object is shared)
_SEND: contextvars.ContextVar[_Send | None] = contextvars.ContextVar("hubpool_send", default=None)


class ReuseAwareConnector(aiohttp.TCPConnector):
    """A TCPConnector that tells the relay whether a request went out on a pooled connection,
    and can be told to open a fresh one.

    An engine or peer may close an idle kept-alive connection just as the relay sends on it;
    the request then dies before any byte of an answer. Only on a reused connection is that
    the keep-alive race (a fresh connection that dies that way is a real failure), so the
    relay needs to know which it was, and its one retry must not take another pooled
    connection the same engine may be closing too. aiohttp says neither; the protocols this
    connector handed out are remembered weakly (a closed connection's is collected)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # noqa: D107
        super().__init__(*args, **kwargs)
        self._handed_out: weakref.WeakSet[Any] = weakref.WeakSet()

    async def _get(self, key: Any, traces: Any) -> Any:
        # aiohttp's pool lookup (private, stable since 3.8): skipped for a retry's fresh connection
        state = _SEND.get()
        if state is not None and state.fresh:
            return None
        return await super()._get(key, traces)

    async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:  # noqa: D102
        conn = await super().connect(req, traces, timeout)
        proto = conn.protocol
        if proto is not None:
            if proto in self._handed_out:
                state = _SEND.get()
                if state is not None:
                    state.reused = True
            else:
                self._handed_out.add(proto)
        return conn


def _reset_before_answer(exc: BaseException) -> bool:
    """The peer closed or reset the connection before sending any byte of a response."""
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        # with part of a response read, aiohttp carries it as the message: then bytes arrived
        return isinstance(exc.message, str)
    # a reset (ECONNRESET, EPIPE) carries no partial message, so whether bytes had arrived is
    # not known: on a reused connection it is taken as the race, as browsers do
    return isinstance(exc, aiohttp.ClientOSError) and not isinstance(exc, aiohttp.ClientConnectorError)


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
    candidates: list[Candidate]
    row: dict[str, Any]
    budget_ms: int
    extra_headers: dict[str, str] = field(default_factory=dict)
    #: the peer that forwarded this request (inbound /local/* rows), else None
    inbound_from: str | None = None
    pin_note: str | None = None
    #: options.num_ctx on the native routes (the window the request asks for), else None
    num_ctx: int | None = None
    #: the pool's own prompt estimate, bytes / 4 of the body as forwarded
    estimated_tokens: int = 0
    #: the placement context and the stages observing the walk (affinity remembers here)
    context: Any = None
    observers: list[Any] = field(default_factory=list)
    row_fault: str | None = None
    #: the request's trace span when the node traces (hubpool_core/telemetry/tracing.py), else None
    span: Any = None

    def context_headers(self) -> dict[str, str]:
        return dict(getattr(self.context, "response_headers", None) or {})


#: a peer also fails over on these: its own pairing checks, saying nothing about the request
PEER_FAILOVER_4XX = frozenset({401, 403, 404, 408, 429})
ENGINE_REFUSAL_WARN_INTERVAL_S = 600
_refusal_warned: dict[tuple[str, str, int], float] = {}


def _attribution(plan: RelayPlan, cand: Candidate, backend: str) -> list[tuple[bytes, bytes]]:
    if plan.inbound_from is not None:
        # a peer relaying from its engine marks the answer: that is how the sender tells an
        # engine's 401/403 from this node refusing the pairing
        return [(b"x-hub-pool-backend", backend.encode())]
    return [
        (b"x-hub-pool-served-by", cand.node.encode()),
        (b"x-hub-pool-backend", backend.encode()),
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


class _Failed(Exception):
    def __init__(self, status: int | None, reason: str, deadline: bool = False, verdict: _Verdict | None = None):
        super().__init__(reason)
        self.status, self.reason, self.deadline, self.verdict = status, reason, deadline, verdict


@dataclass
class _Verdict:
    """An engine's 500 that is a verdict on the request, held to be returned if it stands."""

    signature: str
    cand: Candidate
    status: int
    body: bytes
    headers: list[tuple[bytes, bytes]]
    window: int | None
    renders_own_template: bool


DEFINITIVE = frozenset({"no-user-query", "missing-messages"})
VERDICT_BODY_LIMIT = 64 * 1024
VERDICT_READ_S = 5.0


class RelayResponse(Response):
    """ASGI response that performs the walk for one planned request. It subclasses
    Response only so the framework hands it the raw send/receive; it builds no body."""

    #: the current attempt's trace span (set only when the plan has a span)
    _attempt_span: Any = None

    def __init__(self, node: Any, plan: RelayPlan):  # noqa: D107 - Response.__init__ deliberately not called
        self.node = node
        self.plan = plan
        self.background = None
        self.status_code = 200
        #: the upstream answer being pumped: a hang-up closes it, which wakes the pump's read
        #: (racing every chunk's read against the hang-up cost two tasks per chunk)
        self._live: aiohttp.ClientResponse | None = None
        #: the task walking the candidates, and whether it is inside _until (a hang-up then
        #: cancels it there) and was cancelled by the hang-up (rather than by the server)
        self._task: asyncio.Task[Any] | None = None
        self._waiting = False
        self._hung_up = False

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        gone = asyncio.Event()

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    gone.set()
                    if self._live is not None:
                        self._live.close()
                    if self._waiting and not self._hung_up and self._task is not None:
                        self._hung_up = True
                        self._task.cancel()
                    return

        self._task = asyncio.current_task()
        span = self.plan.span
        if span is not None:  # traced: the span notes the status sent back
            send = self.node.tracer.watch(span, send)
        watcher = asyncio.ensure_future(watch())
        started = time.monotonic()
        try:
            await self._walk(send, gone, started)
        finally:
            watcher.cancel()
            row = self.plan.row
            if row["totalMs"] is None:
                row["totalMs"] = int((time.monotonic() - started) * 1000)
            if row["outcome"] == "pending":
                self.node.routing_log.touch(row, outcome="failed", reason=row["reason"] or "ended without an answer")
            self.node.plugins.broadcast_request_finished(row)
            if span is not None:  # after the last chunk, not at the headers
                self.node.tracer.end_request(span, row)

    # -- helpers -----------------------------------------------------------------------
    def _engine_for(self, cand: Candidate) -> Any:
        """The engine object that knows this candidate's dialect details (by kind, for peers)."""
        if cand.is_local:
            return cand.local.engine
        return self.node.engine_by_kind.get(cand.backend)

    def _is_final(self, cand: Candidate) -> Any:
        engine = self._engine_for(cand)
        if engine is not None:
            return engine.is_final_frame
        from hubpool_core.engine import Engine

        return lambda dialect, frame: Engine.is_final_frame(None, dialect, frame)  # type: ignore[arg-type]

    def _quarantine_key(self, cand: Candidate) -> tuple[str, str, str]:
        return (cand.node, cand.backend, fold_model_id(self.plan.model))

    def _window(self, cand: Candidate) -> int | None:
        """The window this candidate would run the request at, or None when unknown here."""
        engine = self._engine_for(cand)
        if engine is not None and engine.renders_own_template:
            if self.plan.num_ctx:
                return self.plan.num_ctx
            if cand.is_local:
                return self.node.settings.current.maxNumCtx
            caps = cand.peer.last_capabilities if cand.peer is not None else None
            value = caps.get("maxNumCtx") if isinstance(caps, dict) else None
            return value if isinstance(value, int) and value > 0 else None
        if cand.is_local:
            for m in cand.local.snapshot.result.models:
                if same_model(m.id, self.plan.model):
                    return m.context_window
        return None  # a peer's cap says nothing about the window its other engines run

    async def _open(self, cand: Candidate) -> tuple[Any, NativeToOpenAI | None]:
        """The upstream request for one candidate (not yet awaited) and its translator."""
        plan = self.plan
        if cand.is_local:
            engine = cand.local.engine
            translator = None
            route, body_bytes = plan.route, plan.raw
            if plan.dialect not in engine.dialects:
                translator = NativeToOpenAI(plan.route, plan.body, plan.stream)
                route, body_bytes = translator.upstream_route, json.dumps(translator.upstream_body).encode()
            dialect = OPENAI if translator else plan.dialect
            url = engine.base_url + engine.upstream_path(dialect, route)
            headers = {"Content-Type": "application/json", **engine.auth_headers()}
        else:
            path = LOCAL_PREFIX + plan.route
            try:
                auth = await self.node.peer_client.auth_headers(cand.peer, "POST", path, None)
            except PeerAuthError as exc:
                raise _Failed(None, str(exc)) from None
            url = self.node.peer_client.base_url(cand.node) + path
            headers = {"Content-Type": "application/json", **auth, "X-Hub-Pool-Backend": cand.backend,
                       "X-Hub-Pool-Model": plan.model, "X-Hub-Pool-Request-Id": plan.row["id"]}
            if plan.span is not None:  # the peer's span continues this attempt's trace (not signed)
                self.node.tracer.inject(self._attempt_span, headers)
            translator, body_bytes = None, plan.raw
        headers.update(plan.extra_headers)
        request = self.node.session.post(url, data=body_bytes, headers=headers,
                                         skip_auto_headers=("Accept-Encoding",))
        return request, translator

    async def _send(self, cand: Candidate, gone: asyncio.Event,
                    attempt_started: float) -> tuple[aiohttp.ClientResponse, NativeToOpenAI | None]:
        """Send one attempt and wait for the answer's headers, within the plan's budget.

        When the request went out on a reused keep-alive connection and the other side closed
        or reset it before any byte of an answer, it is sent once more on a fresh connection:
        the engine (or peer) closed the idle connection just as it was reused, and never saw
        the request (RFC 9112 §9.3.1; browsers and Envoy retry this case). Anything else, and
        any second failure, is the attempt's failure as before."""
        budget_s = self.plan.budget_ms / 1000
        request, translator = await self._open(cand)
        state = _Send()
        token = _SEND.set(state)
        try:
            return await self._until(request, gone, budget_s), translator
        except aiohttp.ClientError as exc:
            if not (state.reused and _reset_before_answer(exc)):
                raise
            first = exc
            log.info("%s closed a kept-alive connection as it was reused (%s): sending again on a fresh one",
                     cand.node, _transport_code(exc))
        finally:
            _SEND.reset(token)
        remaining = budget_s - (time.monotonic() - attempt_started)
        if remaining <= 0:
            raise TimeoutError()
        # _open again: a peer's signature carries a nonce, which is never sent twice
        request, translator = await self._open(cand)
        token = _SEND.set(_Send(fresh=True))
        try:
            return await self._until(request, gone, remaining), translator
        except aiohttp.ClientError:
            # the retry failed too (a node that died mid-request refuses the fresh connection):
            # the attempt's reason is what happened to the request itself, not to its retry
            raise first from None
        finally:
            _SEND.reset(token)

    async def _until(self, awaitable: Any, gone: asyncio.Event, timeout: float | None) -> Any:
        """Await ``awaitable`` in this task unless the app hangs up first (ClientGone: the
        watcher cancels the wait, which closes the upstream socket, which is how the engine
        learns to stop) or ``timeout`` seconds pass (TimeoutError).

        Awaited in place: racing it against the hang-up in two new tasks per wait cost more
        than the rest of a non-streamed request's own work (docs/performance.md, step 6)."""
        if gone.is_set():
            if asyncio.iscoroutine(awaitable):
                awaitable.close()
            raise ClientGone()
        self._waiting = True
        try:
            if timeout is None:
                return await awaitable
            async with asyncio.timeout(timeout):
                return await awaitable
        except asyncio.CancelledError:
            if not self._hung_up:
                raise  # the server is stopping this request: not ours to swallow
            self._hung_up = False
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            raise ClientGone() from None
        finally:
            self._waiting = False

    def _observe(self, hook: str, *args: Any) -> None:
        for stage in self.plan.observers:
            try:
                getattr(stage, hook)(self.plan.context, *args)
            except Exception:  # noqa: BLE001 - an observer must not break the relay
                log.exception("stage %s failed in %s", getattr(stage, "name", stage), hook)

    # -- the walk ----------------------------------------------------------------------
    async def _walk(self, send: Any, gone: asyncio.Event, started: float) -> None:
        plan, log_, load = self.plan, self.node.routing_log, self.node.load
        row = plan.row
        total = len(plan.candidates)
        failures: list[_Failed] = []
        pending: _Verdict | None = None
        judged = plan.route in COMPLETION_ROUTES  # the leaf judges the same bytes as the entry node
        for attempt, cand in enumerate(plan.candidates, start=1):
            last = attempt == total
            self._observe("placed" if attempt == 1 else "failed_over", cand)
            log_.touch(row, node=plan.inbound_from or cand.node, peerId=cand.peer_id, backend=cand.backend,
                       attempt=attempt)
            work = (cand.backend, plan.model, plan.num_ctx) if cand.is_local else None
            # a sample is taken only when the node had nothing else in flight, as far as we can tell
            alone = (load.local == 0) if cand.is_local else (cand.in_flight == 0)
            if plan.span is not None:
                self._attempt_span = self.node.tracer.start_attempt(plan.span, cand, attempt)
            attempt_started = time.monotonic()
            load.acquire(cand.peer_id, work)
            released = False
            try:
                try:
                    upstream, translator = await self._send(cand, gone, attempt_started)
                except ClientGone:
                    waited = int((time.monotonic() - started) * 1000)
                    log_.touch(row, outcome="failed", status=None, clientClosed=True, durationMs=waited,
                               reason=f"the app closed its connection after {waited} ms; {cand.node} had not "
                                      "answered yet")
                    return
                except TimeoutError:
                    if plan.stream and plan.route in COMPLETION_ROUTES:
                        self.node.throughput.record_deadline_miss(cand.node, cand.backend, fold_model_id(plan.model),
                                                                  plan.estimated_tokens, plan.budget_ms)
                    raise _Failed(None, f"No response headers within {plan.budget_ms}ms", deadline=True) from None
                except aiohttp.ClientError as exc:
                    raise _Failed(None, f"fetch failed ({_transport_code(exc)})") from None
                status = upstream.status
                if status == 500 and (cand.is_local or "x-hub-pool-backend" in upstream.headers) \
                        and plan.inbound_from is None:
                    verdict = await self._read_verdict(cand, upstream, gone)
                    if verdict is not None:
                        done = self._settle_verdict(verdict, pending, attempt)
                        if done is not None:
                            await self._send_verdict(send, *done, started)
                            return
                        pending = pending or verdict
                        raise _Failed(500, f"HTTP 500 ({verdict.signature})", verdict=verdict)
                if self._fails_over(cand, upstream, last):
                    upstream.release()
                    if cand.is_local and status >= 500:
                        self._unservable(cand, f"HTTP {status}")
                    raise _Failed(status, f"HTTP {status}")
                held = None
                streamed = any(t in upstream.headers.get("Content-Type", "") for t in STREAM_TYPES)
                if judged and status == 200 and not streamed:
                    held = await self._read_whole(upstream, gone)
                    dialect = OPENAI if translator else plan.dialect
                    fault = judge_whole(dialect, held) if held is not None else None
                    if fault is not None:
                        self._output_fault(cand, fault)
                        if not last:
                            upstream.release()
                            raise _Failed(status, fault)
                        # the last candidate's answer goes back as the engine gave it, recorded
                        self.plan.row_fault = fault
                    else:
                        self._clean(cand)
                try:
                    judge = await self._commit(send, gone, upstream, cand, translator, started, held=held,
                                               judged=judged)
                    if judged and alone and status == 200 and row["outcome"] == "served":
                        self._sample(cand, attempt_started, held, judge)
                finally:
                    load.release(cand.peer_id, work)
                    released = True
                return
            except _Failed as failure:
                failures.append(failure)
                self._passed_over(cand, failure)
                if cand.is_local:
                    self.node.local.invalidate(cand.local.engine)
            finally:
                if not released:
                    load.release(cand.peer_id, work)
                if plan.span is not None:
                    self.node.tracer.end_attempt(self._attempt_span, row, attempt)
        self._observe("exhausted")
        if failures and failures[-1].verdict is not None:
            # no candidate left to ask: a verdict waiting for a second node is returned anyway
            last_verdict = failures[-1].verdict
            basis = "last-candidate"
            confirms = None
            if pending is not None and pending is not last_verdict and pending.signature == last_verdict.signature:
                basis, confirms = "confirmed", pending.cand.node
            await self._send_verdict(send, last_verdict, basis, confirms, started)
            return
        await self._exhausted(send, failures, started)

    async def _read_verdict(self, cand: Candidate, upstream: aiohttp.ClientResponse,
                            gone: asyncio.Event) -> _Verdict | None:
        """Read a 500's body (at most 64 KB, within 5 s) and ask the engine what it means."""
        engine = self._engine_for(cand)
        if engine is None:
            return None
        try:
            body = await self._until(upstream.content.read(VERDICT_BODY_LIMIT + 1), gone, VERDICT_READ_S)
        except (TimeoutError, aiohttp.ClientError):
            return None
        if len(body) > VERDICT_BODY_LIMIT:
            return None
        try:
            parsed = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return None
        if not isinstance(parsed, dict):
            return None
        try:
            signature = engine.request_error(500, parsed)
        except Exception:  # noqa: BLE001 - a plugin bug means "no verdict"
            signature = None
        if signature not in REQUEST_ERROR_SIGNATURES:
            return None
        if signature == "chat-template" and cand.is_local:
            self._unservable(cand, "chat-template")  # the node's own copy of the model can be what is broken
        return _Verdict(signature, cand, upstream.status, body, _pass_headers(upstream), self._window(cand),
                        bool(engine.renders_own_template))

    def _settle_verdict(self, verdict: _Verdict, pending: _Verdict | None,
                        attempt: int) -> tuple[_Verdict, str, str | None] | None:
        """(verdict, basis, confirms) when it stands now; None when the walk goes on."""
        if verdict.signature in DEFINITIVE:
            return verdict, "definitive", None
        if pending is None or pending.signature != verdict.signature:
            return None
        if verdict.signature == "context-length" and (verdict.window is None or verdict.window != pending.window):
            return None  # the second must run the same window
        ahead = self.plan.candidates[attempt:]
        if verdict.signature == "context-length":
            if any((w := self._window(c)) is None or w > verdict.window for c in ahead):
                return None  # a larger window, or one this node cannot see, might serve it
        else:
            refusers = {pending.renders_own_template, verdict.renders_own_template}
            for c in ahead:
                engine = self._engine_for(c)
                if engine is None or engine.renders_own_template not in refusers:
                    return None  # an engine that has not refused might answer otherwise
        return verdict, "confirmed", pending.cand.node

    async def _send_verdict(self, send: Any, verdict: _Verdict, basis: str, confirms: str | None,
                            started: float) -> None:
        """The engine's own body and headers; 400 (a template keeps its 500)."""
        plan, row = self.plan, self.plan.row
        status = 500 if verdict.signature == "chat-template" else 400
        headers = [(k, v) for k, v in verdict.headers if k not in (b"content-type",)]
        headers.append((b"content-type", b"application/json"))
        headers += _attribution(plan, verdict.cand, verdict.cand.backend)
        if status != verdict.status:
            headers.append((b"x-hub-pool-upstream-status", str(verdict.status).encode()))
        headers += [(k.lower().encode(), v.encode()) for k, v in plan.context_headers().items()]
        self.node.routing_log.touch(
            row, outcome="failed", status=verdict.status, node=plan.inbound_from or verdict.cand.node,
            peerId=verdict.cand.peer_id, backend=verdict.cand.backend,
            durationMs=int((time.monotonic() - started) * 1000), reason=f"HTTP 500 ({verdict.signature})",
            requestError={"signature": verdict.signature, "basis": basis, "confirms": confirms})
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": verdict.body})

    async def _read_whole(self, upstream: aiohttp.ClientResponse, gone: asyncio.Event) -> bytes | None:
        """A non-streamed completion, read whole before anything is sent (it is judged first)."""
        try:
            body = await self._until(upstream.content.read(MAX_JUDGED_BODY_BYTES + 1), gone, None)
        except aiohttp.ClientError as exc:
            raise _Failed(upstream.status, f"{TRUNCATED} ({_transport_code(exc)})") from None
        if len(body) > MAX_JUDGED_BODY_BYTES:
            return body  # too large to judge: relayed as is (the rest follows)
        return body

    def _output_fault(self, cand: Candidate, fault: str) -> None:
        if self.node.output_quarantine.strike(self._quarantine_key(cand), fault):
            log.warning("withholding %s's %s for %s: %s twice within five minutes", cand.node, cand.backend,
                        self.plan.model, fault)

    def _unservable(self, cand: Candidate, reason: str) -> None:
        key = ("local", cand.backend, fold_model_id(self.plan.model))
        if self.node.unservable.strike(key, reason):
            log.warning("withholding %s on the local %s from routing: %s twice within five minutes",
                        self.plan.model, cand.backend, reason)

    def _clean(self, cand: Candidate) -> None:
        """One clean, complete answer ends a withhold."""
        if self.node.output_quarantine.clear(self._quarantine_key(cand)):
            log.info("%s's %s answers %s cleanly again", cand.node, cand.backend, self.plan.model)
        if cand.is_local and self.node.unservable.clear(("local", cand.backend, fold_model_id(self.plan.model))):
            self.node.local.invalidate(cand.local.engine)  # the release is seen by the very next request

    def _fails_over(self, cand: Candidate, upstream: aiohttp.ClientResponse, last: bool) -> bool:
        status = upstream.status
        if self.plan.inbound_from is not None:
            return False  # a forward is never re-routed here: the engine's answer goes back, marked
        if status >= 500 or status in LOCAL_FAILOVER_4XX:
            return True
        if cand.is_local or status not in PEER_FAILOVER_4XX:
            return False
        marked = "x-hub-pool-backend" in upstream.headers
        if marked and status in (401, 403):
            engine = upstream.headers.get("x-hub-pool-backend", cand.backend)
            key = (cand.node, engine, status)
            now = time.monotonic()
            if now - _refusal_warned.get(key, -1e9) >= ENGINE_REFUSAL_WARN_INTERVAL_S:
                _refusal_warned[key] = now
                log.warning("%s's %s answered %s: check the API key that peer holds for it", cand.node, engine, status)
            else:
                log.debug("%s's %s answered %s again", cand.node, engine, status)
            return not last  # from the last candidate it goes back as the engine's answer
        if status in (401, 403, 404) and not marked:
            # the peer's own pairing checks: it stopped trusting us; drop what it offered
            self.node.peers.update(cand.peer_id, last_capabilities=None)
            log.warning("%s refused this node (%s): its cached capabilities are dropped until it answers a "
                        "health poll", cand.node, status)
        return True

    def _passed_over(self, cand: Candidate, failure: _Failed) -> None:
        row = self.plan.row
        row["failedOverFrom"].append(cand.node)
        row["attempts"].append({"node": cand.node, "backend": cand.backend, "status": failure.status,
                                "reason": failure.reason[:200]})
        log.warning("failover: %s (%s) passed over for %s: %s", cand.node, cand.backend, self.plan.model,
                    failure.reason)

    async def _exhausted(self, send: Any, failures: list[_Failed], started: float) -> None:
        plan, row = self.plan, self.plan.row
        total = len(plan.candidates)
        last = failures[-1].reason if failures else "no candidate answered"
        if failures and all(f.deadline for f in failures):
            message = (f'No pool candidate answered for model "{plan.model}" within its deadline ({total} '
                       f"candidate{'s' if total != 1 else ''} tried; {plan.budget_ms} ms each). This is a deadline, "
                       "not proof the nodes are down — a long prompt on a busy node can take longer; "
                       "HUB_POOL_FIRST_BYTE_TIMEOUT_MS and HUB_POOL_MIN_PREFILL_TOKENS_PER_SEC size it.")
        else:
            message = f'All {total} pool candidates for model "{plan.model}" failed: {last}'
        if plan.pin_note:
            message += " " + plan.pin_note
        self.node.routing_log.touch(row, outcome="failed", status=502, reason=last,
                                    durationMs=int((time.monotonic() - started) * 1000))
        headers = [(b"content-type", b"application/json"), (b"x-hub-pool-request-id", row["id"].encode())]
        headers += [(k.lower().encode(), v.encode()) for k, v in plan.context_headers().items()]
        await send({"type": "http.response.start", "status": 502, "headers": headers})
        await send({"type": "http.response.body", "body": json.dumps({"error": message}).encode()})

    async def _commit(self, send: Any, gone: asyncio.Event, upstream: aiohttp.ClientResponse,
                      cand: Candidate, translator: NativeToOpenAI | None, started: float,
                      held: bytes | None = None, judged: bool = False) -> None:
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
        fault = plan.row_fault
        if fault is not None:
            fields.update(outcome="failed", reason=fault,
                          requestError={"signature": fault, "basis": "node", "confirms": None})
        log_.touch(row, **fields)
        backend = upstream.headers.get("x-hub-pool-backend", cand.backend) if not cand.is_local else cand.backend
        headers = _attribution(plan, cand, backend)
        headers += [(k.lower().encode(), v.encode()) for k, v in plan.context_headers().items()]
        judge = None
        if judged and status == 200 and streamed:
            judge = StreamJudge(OPENAI if translator else plan.dialect, self._is_final(cand))
        try:
            if translator is not None:
                await self._relay_translated(send, gone, upstream, translator, streamed, headers, held, judge)
            else:
                headers = _pass_headers(upstream) + headers
                await send({"type": "http.response.start", "status": status, "headers": headers})
                if held is not None and upstream.content.at_eof():
                    # the whole answer is held: one body message, so one write to the app, not two
                    await send({"type": "http.response.body", "body": held, "more_body": False})
                else:
                    if held is not None:
                        await send({"type": "http.response.body", "body": held, "more_body": True})
                    await self._pump(send, gone, upstream, lambda chunk: (chunk,), judge=judge, cand=cand)
        finally:
            upstream.release() if upstream.content.at_eof() else upstream.close()
        row["totalMs"] = int((time.monotonic() - started) * 1000)
        log_.touch(row)
        return judge

    def _sample(self, cand: Candidate, attempt_started: float, held: bytes | None, judge: Any) -> None:
        """Throughput evidence from an answer that completed cleanly: the engine's own timings
        when it reports them, else a stream's wait for its first byte."""
        plan = self.plan
        if plan.estimated_tokens < MIN_PROMPT_TOKENS:
            return  # mostly fixed cost: neither measured nor judged
        engine = self._engine_for(cand)
        raw = held if held is not None else (judge.last_object if judge is not None else b"")
        try:
            obj = json.loads(raw) if raw else None
        except (ValueError, UnicodeDecodeError, RecursionError):
            obj = None
        timings = None
        if engine is not None and isinstance(obj, dict):
            try:
                timings = engine.timings(obj)
            except Exception:  # noqa: BLE001 - a plugin bug means no sample
                timings = None
        model = fold_model_id(plan.model)
        store = self.node.throughput
        if timings is not None and timings.prefill_ms:
            store.record_prefill(cand.node, cand.backend, model, plan.estimated_tokens, timings.prefill_ms,
                                 prompt_tokens=timings.prompt_tokens, cached_tokens=timings.cached_tokens)
        elif judge is not None and judge.first_chunk_at is not None:
            waited = (judge.first_chunk_at - attempt_started) * 1000
            store.record_prefill(cand.node, cand.backend, model, plan.estimated_tokens, waited, first_byte=True,
                                 prompt_tokens=timings.prompt_tokens if timings else None,
                                 cached_tokens=timings.cached_tokens if timings else None)
        if timings is not None and timings.decode_tokens and timings.decode_ms:
            store.record_decode(cand.node, cand.backend, model, timings.decode_tokens, timings.decode_ms)

    async def _relay_translated(self, send: Any, gone: asyncio.Event, upstream: aiohttp.ClientResponse,
                                translator: NativeToOpenAI, streamed: bool,
                                headers: list[tuple[bytes, bytes]], held: bytes | None, judge: Any) -> None:
        status = upstream.status
        if not streamed or status >= 400:
            raw = held if held is not None else await self._until(upstream.read(), gone, None)
            body = translator.whole(status, raw)
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"application/json")] + headers})
            await send({"type": "http.response.body", "body": body})
            return
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/x-ndjson")] + headers})
        await self._pump(send, gone, upstream, translator.feed, tail=translator.end, judge=judge)

    async def _pump(self, send: Any, gone: asyncio.Event, upstream: aiohttp.ClientResponse,
                    convert: Any, tail: Any = None, judge: Any = None, cand: Candidate | None = None) -> None:
        """Pass chunks as they arrive; stop (closing upstream) when the app hangs up. A judged
        stream is read on the way past: its first slice and last line, nothing recalled."""
        row, log_ = self.plan.row, self.node.routing_log
        reader = upstream.content
        dropped = False
        self._live = upstream
        try:
            while True:
                if gone.is_set():
                    raise ClientGone()
                try:
                    chunk = await reader.readany()
                except aiohttp.ClientError:
                    if gone.is_set():  # the watcher closed the upstream: the app hung up
                        raise ClientGone() from None
                    raise
                if not chunk:
                    break
                if judge is not None:
                    judge.feed(chunk)
                for out in convert(chunk):
                    await send({"type": "http.response.body", "body": out, "more_body": True})
            if tail is not None:
                for out in tail():
                    await send({"type": "http.response.body", "body": out, "more_body": True})
        except ClientGone:
            log_.touch(row, clientClosed=True, outcome="failed", reason="the app closed its connection mid-response")
            return
        except (aiohttp.ClientError, asyncio.IncompleteReadError) as exc:
            # committed: no failover, the stream is left to die visibly (spec: Failover). But an
            # answer whose final frame already passed was whole: the app got all of it.
            whole = judge is not None and judge.verdict() is None and judge.recognised
            dropped = not whole
            if dropped:
                log_.touch(row, outcome="failed", reason=f"{TRUNCATED} ({_transport_code(exc)})",
                           requestError={"signature": TRUNCATED, "basis": "node", "confirms": None})
            else:
                log.debug("%s closed after the final frame of %s (%s)", self.plan.model, row["id"],
                          _transport_code(exc))
        if judge is not None and cand is not None:
            fault = judge.verdict(dropped=dropped)
            if fault is not None:
                self._output_fault(cand, f"{fault} ({DROPPED})" if dropped else fault)
                if not dropped:
                    log_.touch(row, outcome="failed", reason=fault,
                               requestError={"signature": fault, "basis": "node", "confirms": None})
            else:
                self._clean(cand)
        elif dropped and cand is not None:
            self._output_fault(cand, f"{TRUNCATED} ({DROPPED})")
        await send({"type": "http.response.body", "body": b"", "more_body": False})


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
