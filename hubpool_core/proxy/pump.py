"""Committing to an answer and passing its bytes: holding a stream until its first real
content (the commit point, issue 28), the routing-log fields and headers of a committed
answer (the engine's own, minus hop-by-hop, plus this node's attribution), then the byte
pump that passes chunks as they arrive (through the translator when the engine speaks
another dialect) until the stream ends, breaks, or the app hangs up. Once committed there is
no failover. It is separate because it is the loop every streamed byte runs through: it must
do nothing per chunk beyond reading, feeding the judge and sending.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import aiohttp
from starlette.types import Send

from hubpool_core.placement import Candidate
from hubpool_core.placement.slot_clock import FREE_HEADER
from hubpool_core.proxy.attempt import Failed, transport_code
from hubpool_core.proxy.content import FirstContent
from hubpool_core.proxy.front import Front
from hubpool_core.proxy.hangup import ClientGone, Hangup
from hubpool_core.proxy.judge import final_frame_check, output_fault, stream_ended
from hubpool_core.proxy.output_check import TRUNCATED, StreamJudge
from hubpool_core.proxy.plan import STREAM_TYPES, RelayPlan, attribution, pass_headers, request_error
from hubpool_core.proxy.translate import Translator, judged_dialect
from hubpool_core.proxy.watch import StreamWatch, ending, resume_ending, watch_for

log = logging.getLogger("hubpool.relay")

#: a stream that has sent this much without a frame this node reads as real content is
#: committed all the same: what it cannot read, it does not hold back
MAX_HELD_BYTES = 64 * 1024


async def hold(plan: RelayPlan, hangup: Hangup, upstream: aiohttp.ClientResponse, translator: Translator | None,
               attempt_started: float) -> bytes:
    """Read a 200 stream until a chunk completes its first frame of real content (a role-only
    or empty delta, an opening event, a ping or a comment is not) and return the bytes read,
    which the commit sends first. Nothing has reached the app yet, so a stream that has no real
    content within the first-byte budget (TimeoutError), or ends or breaks before any (Failed),
    is passed over like one that sent no headers."""
    first = FirstContent(judged_dialect(plan.dialect, translator))
    held = b""
    reader = upstream.content
    while True:
        remaining = plan.budget_ms / 1000 - (time.monotonic() - attempt_started)
        if remaining <= 0:
            raise TimeoutError()
        try:
            chunk = await hangup.until(reader.readany(), remaining)
        except aiohttp.ClientError as exc:
            raise Failed(200, f"{TRUNCATED} ({transport_code(exc)}, before its first token)") from None
        if not chunk:
            if first.end():
                return held
            raise Failed(200, f"{TRUNCATED} (the stream ended before its first token)")
        held += chunk
        if first.feed(chunk) or len(held) > MAX_HELD_BYTES:
            return held


async def commit(node: Any, plan: RelayPlan, hangup: Hangup, send: Send, upstream: aiohttp.ClientResponse,
                 cand: Candidate, translator: Translator | None, started: float,
                 held: bytes | None = None, judged: bool = False) -> StreamJudge | None:
    """Send this answer to the app and pump the rest of it; the stream's judge, if it had one."""
    row, log_ = plan.row, node.routing_log
    status = upstream.status
    ctype = upstream.headers.get("Content-Type", "")
    streamed = any(t in ctype for t in STREAM_TYPES)
    duration = int((time.monotonic() - started) * 1000)
    outcome = "served" if status < 400 else "failed"
    fields: dict[str, Any] = {"status": status, "durationMs": duration, "outcome": outcome}
    if 400 <= status < 500:
        fields["requestError"] = request_error(plan, "client-error", "status")
        fields["reason"] = f"HTTP {status}"
    elif status >= 500:
        fields["reason"] = f"HTTP {status}"
    fault = plan.row_fault
    if fault is not None:
        fields.update(outcome="failed", reason=fault, requestError=request_error(plan, fault, "node"))
    log_.touch(row, **fields)
    backend = upstream.headers.get("x-hub-pool-backend", cand.backend) if not cand.is_local else cand.backend
    headers = attribution(plan, cand, backend)
    if plan.inbound_from is not None:  # the sender's view of this node, fresher than its poll
        headers.append((b"x-hub-pool-in-flight", str(node.load.local).encode()))
        free = node.slot_clock.header_value(cand.backend, getattr(cand.local.snapshot.result, "slots", None)) \
            if cand.local is not None else None
        if free is not None:
            headers.append((FREE_HEADER.encode(), free.encode()))
    headers += [(k.lower().encode(), v.encode()) for k, v in plan.context_headers().items()]
    judge = watch = None
    if judged and status == 200 and streamed:
        # judged in the engine's own dialect: a translated stream is judged on its upstream bytes
        judge = StreamJudge(judged_dialect(plan.dialect, translator), final_frame_check(node, cand))
        if plan.running is not None:
            judge.on_first = plan.running.first_token
        watch = watch_for(node, plan, upstream, judged_dialect(plan.dialect, translator))
    resume = plan.resume
    try:
        if resume is not None and resume.continuing:
            # a continuation: the app's stream is open; this attempt's frames are spliced into it
            convert = translator.feed if translator is not None and streamed else (lambda chunk: (chunk,))
            tail = translator.end if translator is not None and streamed else None
            await pump(node, plan, hangup, send, upstream, convert, tail=tail, judge=judge, cand=cand,
                       first=held, watch=watch, translator=translator)
        elif translator is not None:
            await relay_translated(node, plan, hangup, send, upstream, cand, translator, streamed, headers, held,
                                   judge, watch)
        else:
            headers = pass_headers(upstream) + headers
            await send({"type": "http.response.start", "status": status, "headers": headers})
            send = body_send(send)
            if held is not None and streamed:
                # a stream held to its first real content: the pump sends those bytes first
                await pump(node, plan, hangup, send, upstream, lambda chunk: (chunk,), judge=judge, cand=cand,
                           first=held, watch=watch)
            elif held is not None and upstream.content.at_eof():
                # the whole answer is held: one body message, so one write to the app, not two
                await send({"type": "http.response.body", "body": held, "more_body": False})
            else:
                if held is not None:
                    await send({"type": "http.response.body", "body": held, "more_body": True})
                await pump(node, plan, hangup, send, upstream, lambda chunk: (chunk,), judge=judge, cand=cand,
                           watch=watch)
    finally:
        if watch is not None:
            watch.stop()
        upstream.release() if upstream.content.at_eof() else upstream.close()
    row["totalMs"] = int((time.monotonic() - started) * 1000)
    log_.touch(row)
    return judge


async def relay_translated(node: Any, plan: RelayPlan, hangup: Hangup, send: Send, upstream: aiohttp.ClientResponse,
                           cand: Candidate, translator: Translator, streamed: bool,
                           headers: list[tuple[bytes, bytes]], held: bytes | None, judge: StreamJudge | None,
                           watch: StreamWatch | None = None) -> None:
    """Send the answer in the app's dialect. The judge reads the upstream bytes before the
    translator does, and the stream is concluded with its candidate like any other."""
    status = upstream.status
    if not streamed or status >= 400:
        raw = held if held is not None else await hangup.until(upstream.read(), None)
        body = translator.whole(status, raw)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")] + headers})
        await send({"type": "http.response.body", "body": body})
        return
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", translator.stream_content_type)] + headers})
    await pump(node, plan, hangup, body_send(send), upstream, translator.feed, tail=translator.end, judge=judge,
               cand=cand, first=held, watch=watch, translator=translator)


def body_send(send: Send) -> Send:
    """The send an answer's body goes through once its start has gone (see proxy/front.py)."""
    return send.for_body() if isinstance(send, Front) else send


async def pump(node: Any, plan: RelayPlan, hangup: Hangup, send: Send, upstream: aiohttp.ClientResponse,
               convert: Callable[[bytes], Iterable[bytes]], tail: Callable[[], Iterable[bytes]] | None = None,
               judge: StreamJudge | None = None, cand: Candidate | None = None, first: bytes | None = None,
               watch: StreamWatch | None = None, translator: Translator | None = None) -> None:
    """Pass chunks as they arrive (``first``: what was read before the commit, sent before
    them); stop (closing upstream) when the app hangs up. A judged stream is read on the way
    past: its first slice and last line, nothing recalled; a watched one ends on a stall or a
    loop (proxy/watch.py) with the dialect's error event."""
    row, log_ = plan.row, node.routing_log
    reader = upstream.content
    gone = hangup.gone
    dropped = False
    hangup.live = upstream
    resume = plan.resume
    if resume is not None:  # the app's side is read (and a continuation's rewritten) on the way
        inner, inner_tail = convert, tail
        convert = lambda chunk: resume.wrap(inner(chunk))  # noqa: E731
        tail = (lambda: resume.wrap(inner_tail())) if inner_tail is not None else None
    try:
        chunk = first or b""
        while True:
            if chunk:
                if judge is not None:
                    judge.feed(chunk)
                looped = watch is not None and watch.saw(chunk)
                for out in convert(chunk):
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                if looped:
                    break
            if gone.is_set():
                raise ClientGone()
            try:
                chunk = await reader.readany()
            except aiohttp.ClientError:
                if gone.is_set():  # the watcher closed the upstream: the app hung up
                    raise ClientGone() from None
                if watch is not None and watch.ended:  # the watch closed it: a stall
                    break
                raise
            if not chunk:
                break
        if watch is not None and watch.ended:
            if not resumed(node, plan, cand, watch.reason(), watch.ended):
                await cut(node, plan, send, cand, watch, translator, judge)
            return
        if tail is not None:
            for out in tail():
                await send({"type": "http.response.body", "body": out, "more_body": True})
    except ClientGone:
        if judge is not None and judge.recognised and judge.verdict() is None:
            # the final frame already went out: the app had the whole answer and closed after it
            # (Codex hangs up on response.completed, before the stream's own end) — served
            log.debug("the app closed %s after its final frame", row["id"])
            if cand is not None:
                stream_ended(node, plan, cand, judge, False)
            return
        log_.touch(row, clientClosed=True, outcome="failed", reason="the app closed its connection mid-response")
        return
    except (aiohttp.ClientError, asyncio.IncompleteReadError) as exc:
        if watch is not None and watch.ended:  # the watch closed it mid-read
            if not resumed(node, plan, cand, watch.reason(), watch.ended):
                await cut(node, plan, send, cand, watch, translator, judge)
            return
        if resumed(node, plan, cand, f"{TRUNCATED} ({transport_code(exc)})", TRUNCATED):
            return
        # committed: no failover, the stream is left to die visibly (spec: Failover). But an
        # answer whose final frame already passed was whole: the app got all of it.
        whole = judge is not None and judge.verdict() is None and judge.recognised
        dropped = not whole
        if dropped:
            log_.touch(row, outcome="failed", reason=f"{TRUNCATED} ({transport_code(exc)})",
                       requestError=request_error(plan, TRUNCATED, "node"))
        else:
            log.debug("%s closed after the final frame of %s (%s)", plan.model, row["id"], transport_code(exc))
    if cand is not None and (judge is not None or dropped):
        stream_ended(node, plan, cand, judge, dropped)
    end = b""
    # resume is on: a cut it cannot continue says so, on a route it never continues too
    # (legacy completions, generate), where the stream is not read for resuming (plan.resume)
    says_so = resume is not None or (judge is not None and bool(node.settings.current.poolStreamResume)
                                     and plan.inbound_from is None)
    if dropped and says_so:
        first = judge.first_bytes if judge is not None else b""
        last = judge.last_object if judge is not None else b""
        end = ending(plan, f"hubpool could not finish this answer: the engine's stream broke ({row['reason']})",
                     translator, first, last) if resume is None or not resume.continuing \
            else resume_ending(plan, row["reason"])
    await send({"type": "http.response.body", "body": end, "more_body": False})


async def cut(node: Any, plan: RelayPlan, send: Send, cand: Candidate | None, watch: StreamWatch,
              translator: Translator | None, judge: StreamJudge | None) -> None:
    """A stream the watch ended (stalled, looping): recorded and struck as an output fault,
    and ended for the app with the dialect's error event."""
    reason = watch.reason()
    assert watch.ended is not None
    node.routing_log.touch(plan.row, outcome="failed", reason=reason,
                           requestError=request_error(plan, watch.ended, "node"))
    if cand is not None:
        output_fault(node, plan.model, cand, watch.ended)
    log.warning("%s: %s's stream for %s ended: %s", plan.row["id"], cand.node if cand else "?", plan.model, reason)
    message = f"hubpool ended this stream: the engine {watch.detail}" if watch.ended == "stalled" else \
        f"hubpool ended this stream: the engine's answer is looping ({watch.detail})"
    first = judge.first_bytes if judge is not None else b""
    last = judge.last_object if judge is not None else b""
    end = resume_ending(plan, message) if plan.resume is not None and plan.resume.continuing else \
        ending(plan, message, translator, first, last)
    await send({"type": "http.response.body", "body": end, "more_body": False})


def resumed(node: Any, plan: RelayPlan, cand: Candidate | None, reason: str, fault: str) -> bool:
    """A stream cut mid-answer: True when the walk will continue it on the next candidate
    (proxy/resume.py), the cut recorded and its engine struck; False when it ends here."""
    resume = plan.resume
    if resume is None or not resume.more or not resume.can_continue() or cand is None:
        return False
    resume.cut = reason
    output_fault(node, plan.model, cand, fault)
    plan.row.setdefault("resumedFrom", []).append(
        {"node": cand.node, "backend": cand.backend, "atChars": len(resume.text), "reason": reason[:200]})
    log.warning("%s: %s's stream for %s cut at %d characters (%s): resuming on the next candidate",
                plan.row["id"], cand.node, plan.model, len(resume.text), reason)
    return True
