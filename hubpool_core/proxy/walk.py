"""The relay: walk the ranked candidates, commit to the first good answer, pass its bytes.

This is the hot path. Upstream calls use the node's one aiohttp ClientSession (httpx cost
3–9 ms CPU per request here and collapsed at 64 streams — docs/performance.md). The
response is a raw ASGI callable so it can race the upstream wait against the client's
disconnect: a client that hangs up before headers aborts the upstream request too, and
the turn is never placed on another candidate. This module holds the response and the walk
(one attempt per candidate, in order, until one is committed to); each step it takes is in
its own module, and the walk only decides between them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import aiohttp
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from hubpool_core.config import whole_in_range
from hubpool_core.engine import AGENT_DIALECTS, RESPONSES
from hubpool_core.models_ids import fold_model_id
from hubpool_core.placement.load import Work
from hubpool_core.placement.slot_clock import FREE_HEADER, parse_free, planned_work
from hubpool_core.placement.speed import SCRATCH_BEFORE
from hubpool_core.proxy.attempt import Failed, send_attempt, transport_code
from hubpool_core.proxy.failover import exhausted, fails_over, passed_over
from hubpool_core.proxy.front import Front, keepalive_eligible
from hubpool_core.proxy.hangup import ClientGone, Hangup, settle_hangup
from hubpool_core.proxy.judge import clean, output_fault, read_whole, sample, unservable
from hubpool_core.proxy.output_check import COMPLETION_ROUTES, TRUNCATED, judge_whole
from hubpool_core.proxy.plan import STREAM_TYPES, RelayPlan
from hubpool_core.proxy.pump import commit, hold
from hubpool_core.proxy.response_homes import response_id
from hubpool_core.proxy.resume import RESUMABLE_ROUTES, Resume
from hubpool_core.proxy.start_within import REFUSAL as BUSY
from hubpool_core.proxy.start_within import allowances
from hubpool_core.proxy.translate import dialect_error, judged_dialect
from hubpool_core.proxy.verdicts import (
    Verdict,
    carry,
    read_verdict,
    send_verdict,
    served_forward_failed,
    settle_at_end,
    settle_verdict,
)
from hubpool_core.proxy.watch import resume_ending

log = logging.getLogger("hubpool.relay")


class RelayResponse(Response):
    """ASGI response that performs the walk for one planned request. It subclasses
    Response only so the framework hands it the raw send/receive; it builds no body."""

    def __init__(self, node: Any, plan: RelayPlan):  # noqa: D107 - Response.__init__ deliberately not called
        self.node = node
        self.plan = plan
        self.background = None
        self.status_code = 200

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hangup = Hangup(asyncio.current_task())
        span = self.plan.span
        if span is not None:  # traced: the span notes the status sent back
            send = self.node.tracer.watch(span, send)
        watcher = asyncio.ensure_future(hangup.watch(receive))
        started = time.monotonic()
        every = self.node.settings.current.poolStreamKeepAliveMs
        front = Front(self.plan, send, every, hangup.gone) if keepalive_eligible(self.plan, every) else None
        try:
            await walk(self.node, self.plan, hangup, front or send, started)
        finally:
            watcher.cancel()
            if front is not None:
                await front.close()
            row = self.plan.row
            if row["totalMs"] is None:
                row["totalMs"] = int((time.monotonic() - started) * 1000)
            if row["outcome"] == "pending":
                self.node.routing_log.touch(row, outcome="failed", reason=row["reason"] or "ended without an answer")
            self.node.plugins.broadcast_request_finished(row)
            if span is not None:  # after the last chunk, not at the headers
                self.node.tracer.end_request(span, row)


def observe(plan: RelayPlan, hook: str, *args: Any) -> None:
    for stage in plan.observers:
        try:
            getattr(stage, hook)(plan.context, *args)
        except Exception:  # noqa: BLE001 - an observer must not break the relay
            log.exception("stage %s failed in %s", getattr(stage, "name", stage), hook)


async def walk(node: Any, plan: RelayPlan, hangup: Hangup, send: Send, started: float) -> None:
    log_, load = node.routing_log, node.load
    row = plan.row
    total = len(plan.candidates)
    failures: list[Failed] = []
    pending: Verdict | None = None
    judged = plan.route in COMPLETION_ROUTES  # the leaf judges the same bytes as the entry node
    # a stream is committed at its first real content, on the node the app asked (a leaf
    # serving a forward relays at once: the entry node holds and judges those same bytes)
    first_token = judged and plan.inbound_from is None and bool(node.settings.current.poolStreamFirstToken)
    if (node.settings.current.poolStreamResume and judged and plan.stream and plan.inbound_from is None
            and plan.route in RESUMABLE_ROUTES):
        plan.resume = Resume(plan.dialect)
    resume = plan.resume
    # the current attempt's trace span (set only when the plan has a span)
    attempt_span: Any = None
    allowed = allowances(plan.context, plan.candidates) if plan.inbound_from is None else {}
    for attempt, cand in enumerate(plan.candidates, start=1):
        last = attempt == total
        plan.start_within = None if resume is not None and resume.continuing else allowed.get(attempt - 1)
        observe(plan, "placed" if attempt == 1 else "failed_over", cand)
        log_.touch(row, node=plan.inbound_from or cand.node, peerId=cand.peer_id, backend=cand.backend,
                   attempt=attempt)
        work = Work(cand.backend, plan.model, plan.num_ctx, judged) if cand.is_local else None
        # a sample (or a missed deadline) counts only when the node had nothing else in flight,
        # as far as we can tell
        alone = (load.local == 0) if cand.is_local else (cand.in_flight == 0)
        cold = node.residency.resident(cand.node, cand.backend, plan.model) is False
        if plan.span is not None:
            attempt_span = node.tracer.start_attempt(plan.span, cand, attempt)
        attempt_started = time.monotonic()
        if not (attempt == 1 and plan.reserved):  # a queued request's first slot is already counted
            load.acquire(cand.peer_id, work)
        plan.running = _on_the_clock(node, plan, cand) if judged and cand.is_local else None
        released = False
        try:
            try:
                upstream, translator = await send_attempt(node, plan, cand, hangup, attempt_started, attempt_span)
            except ClientGone:
                settle_hangup(node, plan, cand, started)
                return
            except TimeoutError:
                _deadline_missed(node, plan, cand, alone)
                raise Failed(None, f"No response headers within {plan.budget_ms}ms", deadline=True) from None
            except aiohttp.ClientError as exc:
                raise Failed(None, f"fetch failed ({transport_code(exc)})") from None
            status = upstream.status
            if cand.peer_id is not None:
                fresh = whole_in_range(upstream.headers.get("x-hub-pool-in-flight"), 0, 999_999)
                if fresh is not None:
                    load.note_fresh(cand.peer_id, fresh)
                    # no schedule beside the count: the peer cannot say now, and an older one is stale
                    free = upstream.headers.get(FREE_HEADER, "")
                    node.peer_slots.note(cand.peer_id, cand.backend,
                                         parse_free(free.split(",")) if 0 < len(free) <= 1024 else None, fresh)
            continuing = resume is not None and resume.continuing
            if status == 500 and (cand.is_local or "x-hub-pool-backend" in upstream.headers) \
                    and plan.inbound_from is None and not continuing:
                verdict = await read_verdict(node, plan, cand, upstream, hangup)
                if verdict is not None and plan.dialect in AGENT_DIALECTS:
                    # an agent reads its own dialect's error shape (the engine may have been asked
                    # in another, here or on the peer); the engine's words are kept
                    verdict.body = dialect_error(plan.dialect, 500 if verdict.signature == "chat-template" else 400,
                                                 verdict.body)
                if verdict is not None:
                    verdict = carry(pending, verdict)
                    done = settle_verdict(node, plan, verdict, attempt)
                    if done is not None:
                        await send_verdict(node, plan, send, *done, started)
                        return
                    pending = verdict
                    raise Failed(500, f"HTTP 500 ({verdict.signature})", verdict=verdict)
            if status == 429 and plan.start_within is not None and upstream.headers.get("x-hub-pool-refusal") == BUSY:
                upstream.release()
                raise Failed(status, f"busy: no slot within the {plan.start_within} ms allowed", busy=True)
            if fails_over(node, plan, cand, upstream, last):
                upstream.release()
                if cand.is_local and status >= 500:
                    unservable(node, plan.model, cand, f"HTTP {status}")
                raise Failed(status, f"HTTP {status}")
            held = None
            if plan.inbound_from is not None and cand.is_local and status >= 500:
                held = await served_forward_failed(node, plan, cand, upstream, hangup)
            streamed = any(t in upstream.headers.get("Content-Type", "") for t in STREAM_TYPES)
            if continuing and (status != 200 or not streamed):
                upstream.release()  # only a stream can continue the app's stream
                raise Failed(status, f"HTTP {status}" if status != 200 else "HTTP 200 (not a stream)")
            if judged and status == 200 and not streamed:
                held = await read_whole(upstream, hangup)
                fault = judge_whole(judged_dialect(plan.dialect, translator), held) if held is not None else None
                if fault is not None:
                    output_fault(node, plan.model, cand, fault)
                    if not last:
                        upstream.release()
                        raise Failed(status, fault)
                    # the last candidate's answer goes back as the engine gave it, recorded
                    plan.row_fault = fault
                else:
                    clean(node, plan.model, cand)
            elif first_token and status == 200 and streamed:
                try:
                    held = await hold(plan, hangup, upstream, translator, attempt_started)
                except ClientGone:
                    settle_hangup(node, plan, cand, started, upstream)
                    return
                except TimeoutError:
                    upstream.close()
                    _deadline_missed(node, plan, cand, alone)
                    raise Failed(None, f"no first token within {plan.budget_ms}ms", deadline=True) from None
                except Failed as failure:
                    upstream.close()
                    output_fault(node, plan.model, cand, TRUNCATED)
                    raise failure
            if resume is not None:
                resume.more = attempt < total
            try:
                judge = await commit(node, plan, hangup, send, upstream, cand, translator, started, held=held,
                                     judged=judged)
                if plan.dialect == RESPONSES and translator is None and status == 200 and plan.inbound_from is None:
                    first = held if held is not None else judge.first_bytes if judge is not None else b""
                    rid = response_id(first, whole=held is not None)
                    if rid is not None:  # a follow-up naming it can only go on there
                        node.response_homes.remember(rid, cand)
                if judged and status == 200 and row["outcome"] == "served" and resume is None:
                    # a stream's held bytes are only its head (poolStreamFirstToken): its timings are
                    # in its last object, which the judge kept
                    sample(node, plan, cand, attempt_started, None if streamed else held, judge, alone=alone,
                           cold=cold)
            finally:
                load.release(cand.peer_id, work)
                _off_the_clock(node, plan)
                released = True
            if resume is not None and resume.cut is not None:
                if _continue(plan, resume):
                    continue  # the next candidate continues the answer
                await send({"type": "http.response.body", "more_body": False,
                            "body": resume_ending(plan, "its token budget is spent")})
            return
        except ClientGone:
            # after the engine's headers, before anything reached the app (a 500's verdict or
            # a body to judge being read): the same hang-up row, and the engine is let go
            settle_hangup(node, plan, cand, started, upstream)
            return
        except Failed as failure:
            failures.append(failure)
            passed_over(plan, cand, failure, last)
            if cand.local is not None:
                node.local.invalidate(cand.local.engine)
        finally:
            if not released:
                load.release(cand.peer_id, work)
                _off_the_clock(node, plan)
            if plan.span is not None:
                node.tracer.end_attempt(attempt_span, row, attempt)
    observe(plan, "exhausted")
    if resume is not None and resume.continuing:
        # the app's stream is open: no status can be sent now, only the dialect's error event
        why = failures[-1].reason if failures else "no candidate left"
        node.routing_log.touch(row, outcome="failed", reason=f"resume failed: {why}")
        await send({"type": "http.response.body", "body": resume_ending(plan, why), "more_body": False})
        return
    if failures and failures[-1].verdict is not None:
        # no candidate left to ask: a verdict waiting for a second node is returned anyway
        last_verdict = failures[-1].verdict
        basis, confirms = settle_at_end(last_verdict)
        await send_verdict(node, plan, send, last_verdict, basis, confirms, started)
        return
    await exhausted(node, plan, send, failures, started)


def _on_the_clock(node: Any, plan: RelayPlan, cand: Any) -> Any:
    """Put the attempt on its engine's slot clock: when it began and how long it should hold
    the slot (the prefill placement predicted, else the whole prompt's, and the answer asked)."""
    clock = getattr(node, "slot_clock", None)
    if clock is None:
        return None
    before = (getattr(plan.context, "scratch", None) or {}).get(SCRATCH_BEFORE, {}).get(id(cand))
    book = getattr(node, "speed", None)
    speed = book.get("local", cand.backend, plan.model) if book is not None else None
    planned, answer = planned_work(speed, plan.estimated_tokens, before, plan.body)
    return clock.start(cand.backend, planned, answer, speed.service_ms if speed is not None else None)


def _off_the_clock(node: Any, plan: RelayPlan) -> None:
    if plan.running is not None:
        node.slot_clock.finish(plan.running)
        plan.running = None


def _deadline_missed(node: Any, plan: RelayPlan, cand: Any, alone: bool) -> None:
    """A streamed completion ran out of its first-byte budget: throughput evidence, taken as a
    sample is, only when the node had nothing else in flight (``alone``): a miss behind other
    work times the queue, not the hardware (issue 26.12)."""
    if plan.stream and plan.route in COMPLETION_ROUTES and alone:
        node.throughput.record_deadline_miss(cand.node, cand.backend, fold_model_id(plan.model),
                                             plan.estimated_tokens, plan.budget_ms)


def _continue(plan: RelayPlan, resume: Resume) -> bool:
    """Make the plan's request the continuation of the answer the app has; False when there
    is nothing left to ask for (its token budget is spent)."""
    resume.cut = None
    try:
        body = resume.body(plan.dialect, plan.route, plan.body)
    except (ValueError, TypeError, AttributeError):
        return False
    plan.body, plan.raw = body, json.dumps(body).encode()
    resume.start_continuation()
    return True
