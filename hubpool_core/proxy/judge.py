"""What the relay does with an answer's output once it is judged: output_check.py says whether
the bytes are an answer; this module reads a non-streamed completion whole so it can be
judged, strikes or clears the engine's withhold (output quarantine, and the local
"unservable" withhold), concludes a judged stream when it ends, and takes the throughput
sample a clean answer carries. It is separate so the walk and the pump only call it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import aiohttp

from hubpool_core.engine import Engine
from hubpool_core.models_ids import fold_model_id
from hubpool_core.placement import Candidate
from hubpool_core.placement.quarantine import DROPPED
from hubpool_core.placement.throughput import MIN_PROMPT_TOKENS
from hubpool_core.proxy.attempt import Failed, transport_code
from hubpool_core.proxy.hangup import Hangup
from hubpool_core.proxy.output_check import MAX_JUDGED_BODY_BYTES, TRUNCATED, StreamJudge
from hubpool_core.proxy.plan import RelayPlan, engine_for, request_error

log = logging.getLogger("hubpool.relay")


def _quarantine_key(cand: Candidate, model: str) -> tuple[str, str, str]:
    return (cand.node, cand.backend, fold_model_id(model))


def output_fault(node: Any, model: str, cand: Candidate, fault: str) -> None:
    if node.output_quarantine.strike(_quarantine_key(cand, model), fault):
        log.warning("withholding %s's %s for %s: %s twice within five minutes", cand.node, cand.backend,
                    model, fault)


def unservable(node: Any, model: str, cand: Candidate, reason: str) -> None:
    key = ("local", cand.backend, fold_model_id(model))
    if node.unservable.strike(key, reason):
        log.warning("withholding %s on the local %s from routing: %s twice within five minutes",
                    model, cand.backend, reason)


def clean(node: Any, model: str, cand: Candidate) -> None:
    """One clean, complete answer ends a withhold."""
    if node.output_quarantine.clear(_quarantine_key(cand, model)):
        log.info("%s's %s answers %s cleanly again", cand.node, cand.backend, model)
    if cand.local is not None and node.unservable.clear(("local", cand.backend, fold_model_id(model))):
        node.local.invalidate(cand.local.engine)  # the release is seen by the very next request


async def read_whole(upstream: aiohttp.ClientResponse, hangup: Hangup) -> bytes | None:
    """A non-streamed completion, read whole before anything is sent (it is judged first)."""
    try:
        body = await hangup.until(upstream.content.read(MAX_JUDGED_BODY_BYTES + 1), None)
    except aiohttp.ClientError as exc:
        raise Failed(upstream.status, f"{TRUNCATED} ({transport_code(exc)})") from None
    return body  # past MAX_JUDGED_BODY_BYTES it is too large to judge: relayed as is, the rest follows


def final_frame_check(node: Any, cand: Candidate) -> Callable[[str, bytes], bool]:
    """How a stream judge tells this candidate's final frame."""
    engine = engine_for(node, cand)
    # without an engine of that kind here, the base class's check (it reads nothing of self)
    check = engine.is_final_frame if engine is not None else partial(Engine.is_final_frame, None)  # type: ignore[arg-type]

    def is_final(dialect: str, frame: bytes) -> bool:
        try:
            return bool(check(dialect, frame))
        except Exception:  # noqa: BLE001 - a plugin bug on a malformed frame must not cut the app's stream
            log.warning("%s's is_final_frame raised on a frame; read as not final", cand.backend, exc_info=True)
            return False

    return is_final


def stream_ended(node: Any, plan: RelayPlan, cand: Candidate, judge: StreamJudge | None, dropped: bool) -> None:
    """A relayed stream ended (``dropped``: by a transport error): strike or clear the engine."""
    if judge is None:
        output_fault(node, plan.model, cand, f"{TRUNCATED} ({DROPPED})")
        return
    fault = judge.verdict(dropped=dropped)
    if fault is not None:
        output_fault(node, plan.model, cand, f"{fault} ({DROPPED})" if dropped else fault)
        if not dropped:
            node.routing_log.touch(plan.row, outcome="failed", reason=fault,
                                   requestError=request_error(plan, fault, "node"))
    else:
        clean(node, plan.model, cand)


def sample(node: Any, plan: RelayPlan, cand: Candidate, attempt_started: float, held: bytes | None,
           judge: StreamJudge | None, alone: bool = True, cold: bool = False) -> None:
    """Evidence from an answer that completed cleanly. The speed book (predicted time to
    first token) takes every answer whose engine timed it, and the wall clock only when the
    node had nothing else in flight (``alone``); so does the throughput store, from prompts
    of 4,096 tokens: the engine's own timings when it reports them, else a stream's wait for
    its first byte. ``cold``: the engine was known not to hold the model, so the wait for the
    first byte beyond the prefill was its load."""
    timings = _timings(node, cand, held, judge)
    _speed(node, plan, cand, attempt_started, judge, timings, alone, cold)
    if plan.estimated_tokens < MIN_PROMPT_TOKENS or not alone:
        return  # mostly fixed cost, or a queue: neither measured nor judged
    model = fold_model_id(plan.model)
    store = node.throughput
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


def _timings(node: Any, cand: Candidate, held: bytes | None, judge: StreamJudge | None) -> Any:
    """The engine's own timings of a finished answer (its body, or a stream's last object)."""
    engine = engine_for(node, cand)
    raw = held if held is not None else (judge.last_object if judge is not None else b"")
    try:
        obj = json.loads(raw) if raw else None
    except (ValueError, UnicodeDecodeError, RecursionError):
        obj = None
    if engine is None or not isinstance(obj, dict):
        return None
    try:
        return engine.timings(obj)
    except Exception:  # noqa: BLE001 - a plugin bug means no sample
        return None


def _speed(node: Any, plan: RelayPlan, cand: Candidate, attempt_started: float, judge: StreamJudge | None,
           timings: Any, alone: bool, cold: bool) -> None:
    book = getattr(node, "speed", None)
    if book is None:
        return
    model = plan.model
    node.residency.served(cand.node, cand.backend, model)
    prefill = timings.prefill_ms if timings is not None else None
    if prefill:
        read = float(plan.estimated_tokens)
        if timings.prompt_tokens and timings.cached_tokens is not None and timings.prompt_tokens > 0:
            read *= max(0, timings.prompt_tokens - timings.cached_tokens) / timings.prompt_tokens
        book.record_read(cand.node, cand.backend, model, read, prefill)
        if timings.decode_ms:
            book.record_service(cand.node, cand.backend, model, prefill + timings.decode_ms)
            if timings.decode_tokens:
                book.record_answer(cand.node, cand.backend, model, timings.decode_tokens, timings.decode_ms)
    elif alone:
        book.record_service(cand.node, cand.backend, model, (time.monotonic() - attempt_started) * 1000)
    if cold and alone and judge is not None and judge.first_chunk_at is not None:
        waited = (judge.first_chunk_at - attempt_started) * 1000
        book.record_load(cand.node, cand.backend, model, waited - (prefill or 0.0))
