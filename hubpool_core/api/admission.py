"""The pool-wide admission queue (``poolAdmissionQueue``; hubpool's own, docs/placement.md).

When every candidate for a request is at its known concurrency (in flight at or beyond the
slots its engine reports or its node states), sending it anyway over-commits one of them:
it waits inside that engine, behind work the pool cannot move. With the queue on, the entry
node holds it instead, in a bounded queue, and places it again — the same placement, the
same stages — whenever a request it counted finishes, so it goes to whichever candidate
frees first (late binding). A candidate whose slots nothing states is never full: a pool
that states nothing never queues.

With predicted time to first token on, a request also waits while waiting for a full
candidate is predicted sooner than starting on every free one (a warm node's slot against a
cold load elsewhere); otherwise it starts on the free one at once.

Order: interactive before batch (``poolAdmissionBatchKeys`` names the inference keys whose
work is batch), then fair share between keys (the key served least goes next), then
arrival. With a first-token target (``poolAdmissionTargetMs``) the waiters that can still
make it go first, newest first, and the rest after them. Overflow answers 429 and a wait
past the request's own budget 503, both with ``Retry-After`` in the route's dialect; a
streamed OpenAI request gets SSE comment keep-alives while it waits (its 200 is then sent
before the wait ends, and a failure after that is an SSE error frame). The routing-log row
carries ``queuedMs``, the answer ``X-Hub-Pool-Queued-Ms``. With the setting at 0 nothing
here runs.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

from starlette.types import Receive, Scope, Send

from hubpool_core.api.dialects import error_body as dialect_error_body
from hubpool_core.config import env_int
from hubpool_core.engine import AGENT_DIALECTS, OPENAI
from hubpool_core.placement import NoAutoModel, PlacementRequest, Plan, place, snapshot_of
from hubpool_core.placement.load import Work
from hubpool_core.placement.speed import SCRATCH_PREDICTED, SCRATCH_SLOT_MS, candidate_slots

log = logging.getLogger("hubpool.admission")

INTERACTIVE, BATCH = 0, 1
#: how often a waiting request is placed again even when nothing this node counted finished
#: (a peer's load changes with its own apps' work, seen at its polls and forwarded answers)
RECHECK_S = 0.25
#: a streamed OpenAI request waiting this long starts getting keep-alive comments, this often
KEEPALIVE_AFTER_S = 5.0
KEEPALIVE_EVERY_S = 5.0
QUEUED_HEADER = "X-Hub-Pool-Queued-Ms"


def _full(cand: Any, settings: Any, engine_by_kind: dict[str, Any]) -> bool:
    slots = candidate_slots(cand, settings, engine_by_kind)
    return slots is not None and cand.in_flight >= slots


def saturated(plan: Plan, settings: Any, engine_by_kind: dict[str, Any], ahead: int = 0) -> bool:
    """Nothing is worth starting now: every candidate is at (or past) its known concurrency,
    or — with predicted time to first token on — waiting for the full candidate predicted
    soonest beats starting on any free one (its wait counted with ``ahead`` more requests
    queued before this one). False when a candidate has a free slot (or states none) and
    waiting is not predicted sooner."""
    if not plan.candidates:
        return False
    full = [c for c in plan.candidates if _full(c, settings, engine_by_kind)]
    if len(full) == len(plan.candidates):
        return True
    return bool(full) and worth_waiting(plan, full, ahead)


def has_free(plan: Plan, settings: Any, engine_by_kind: dict[str, Any]) -> bool:
    """A candidate with a free slot, or one whose slots nothing states."""
    return any(not _full(c, settings, engine_by_kind) for c in plan.candidates)


def worth_waiting(plan: Plan, full: list[Any], ahead: int = 0) -> bool:
    """Whether the predicted-TTFT stage says a full candidate gives the first token sooner, its
    queue wait and ``ahead`` more queued requests' included, than every free candidate (each
    of which it priced: an unmeasured free one is started as before). False when the stage
    did not run (``poolTtftRanking`` 0): the queue then holds only when every slot is taken."""
    scratch = plan.context.scratch
    table, per_slot = scratch.get(SCRATCH_PREDICTED), scratch.get(SCRATCH_SLOT_MS) or {}
    if not isinstance(table, dict):
        return False
    held = {id(c) for c in full}
    priced = [table.get(id(c)) for c in plan.candidates if id(c) not in held]
    free = [p for p in priced if p is not None]
    if not free or len(free) < len(priced):
        return False
    waits = [table[id(c)] + ahead * (per_slot.get(id(c)) or 0.0) for c in full if table.get(id(c)) is not None]
    return bool(waits) and min(waits) < min(free)


def predicted_ms(plan: Plan, cand: Any) -> float | None:
    """The predicted-TTFT stage's figure for one candidate of the plan, or ``None``."""
    table = plan.context.scratch.get(SCRATCH_PREDICTED)
    return table.get(id(cand)) if isinstance(table, dict) else None


def free_first(plan: Plan, settings: Any, engine_by_kind: dict[str, Any]) -> None:
    """With the queue on, a candidate at its known concurrency goes behind every one with a
    free slot (or no stated count), in order otherwise: sending to it would over-commit it
    while another could start the request now."""
    full = [c for c in plan.candidates
            if (slots := candidate_slots(c, settings, engine_by_kind)) is not None and c.in_flight >= slots]
    if full and len(full) < len(plan.candidates):
        plan.candidates = [c for c in plan.candidates if c not in full] + full


@dataclass
class _Pass:
    """What one pass of the pump has decided so far."""

    #: poolAdmissionTargetMs while waiters that can still make it are being placed, then 0
    target: int
    #: models with no free slot anywhere: their later waiters wait
    blocked: set[str] = field(default_factory=set)
    #: model -> waiters held this pass for a full candidate predicted sooner than a free one
    held: dict[str, int] = field(default_factory=dict)


@dataclass(eq=False)
class Waiter:
    request: PlacementRequest
    key: str
    klass: int
    seq: int
    enqueued: float = field(default_factory=time.monotonic)
    ready: asyncio.Future[Plan] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    def waited_ms(self) -> int:
        return int((time.monotonic() - self.enqueued) * 1000)


def target_order(order: list[Waiter], served: dict[str, int], target_ms: int,
                 speedup: int = 1) -> tuple[list[Waiter], list[Waiter]]:
    """(the waiters a pass tries first, those already past the target) for waiters in queue
    order. Without a target: the queue order, nobody late. With one, the waiters that have
    not yet waited it out go first, newest first within a class and share: the newest has the
    most time to spare, so a slot another node took first or a wait misjudged costs it least
    (placed oldest first, a waiter sent at the edge of the target missed it; docs/placement.md).
    ``speedup``: waits are counted on the engines' clock (HUB_POOL_DEV_CLOCK_SPEEDUP)."""
    if not target_ms:
        return list(order), []
    late = [w for w in order if w.waited_ms() * speedup >= target_ms]
    gone = {id(w) for w in late}
    first = sorted((w for w in order if id(w) not in gone), key=lambda w: (w.klass, served.get(w.key, 0), -w.seq))
    return first, late


class AdmissionQueue:
    """The node's one queue, and the pump that places its waiters as capacity frees."""

    def __init__(self, node: Any):
        self.node = node
        self.waiters: list[Waiter] = []
        self.served: dict[str, int] = {}
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self._pump: asyncio.Task[None] | None = None
        #: counters for status and metrics
        self.dispatched = 0
        self.overflowed = 0
        self.expired = 0
        self.abandoned = 0
        self.wait_ms_total = 0
        load = getattr(node, "load", None)
        if load is not None:  # a node whose requests wait for a peer's slot learns that peer's load sub-second
            load.waiting = lambda: bool(self.waiters)
        #: HUB_POOL_DEV_CLOCK_SPEEDUP (bench rigs only; 1 in production): the engines' clock runs
        #: this many times faster than the wall, and predictions are on their clock
        self.speedup = env_int(getattr(getattr(node, "env", None), "dev_clock_speedup", None), minimum=1,
                               maximum=100) or 1

    def wake(self) -> None:
        """A request this node counted finished: capacity may have freed."""
        if self.waiters:
            self._wake.set()

    def waiting_for(self, model: str) -> bool:
        return any(w.request.model == model for w in self.waiters)

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        return {"queued": len(self.waiters),
                "interactive": sum(1 for w in self.waiters if w.klass == INTERACTIVE),
                "batch": sum(1 for w in self.waiters if w.klass == BATCH),
                "oldestWaitMs": int((now - min(w.enqueued for w in self.waiters)) * 1000) if self.waiters else 0,
                "dispatched": self.dispatched, "overflowed": self.overflowed, "expired": self.expired,
                "abandoned": self.abandoned,
                "meanWaitMs": round(self.wait_ms_total / self.dispatched) if self.dispatched else None}

    def enqueue(self, request: PlacementRequest, key: str, klass: int) -> Waiter | None:
        """A new waiter, or ``None`` when the queue is full."""
        limit = int(self.node.settings.current.poolAdmissionQueue or 0)
        if len(self.waiters) >= limit:
            self.overflowed += 1
            return None
        waiting = [self.served.get(w.key, 0) for w in self.waiters if w.klass == klass]
        if waiting:  # a key arriving now does not jump the keys already waiting
            self.served[key] = max(self.served.get(key, 0), min(waiting))
        waiter = Waiter(request, key, klass, next(self._seq))
        self.waiters.append(waiter)
        if self._pump is None or self._pump.done():
            self._pump = asyncio.ensure_future(self._run())
        self._wake.set()
        return waiter

    def leave(self, waiter: Waiter) -> None:
        if waiter in self.waiters:
            self.waiters.remove(waiter)

    def ordered(self) -> list[Waiter]:
        return sorted(self.waiters, key=lambda w: (w.klass, self.served.get(w.key, 0), w.seq))

    async def _run(self) -> None:
        while self.waiters:
            try:
                await asyncio.wait_for(self._wake.wait(), RECHECK_S)
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self._place_waiters()
            except Exception:  # noqa: BLE001 - the pump must outlive one bad placement
                log.exception("admission queue: placing a waiter failed")

    def _still_waiting(self, waiter: Waiter) -> bool:
        """Whether ``waiter`` is still this queue's to place: its app may have hung up, or its
        budget run out, while the pump awaited (it then left the queue, and nobody would read
        a plan, nor release the slot reserved for it)."""
        return waiter in self.waiters and not waiter.ready.done()

    async def _place_waiters(self) -> None:
        """One pass over the waiters in order. A model none of whose candidates has a free slot
        blocks its later waiters (they keep their order). A waiter for whom waiting for a full
        candidate is predicted sooner than a free one is held, and counts as queued ahead of
        the next waiter for that model, who may then start on the free one at once. With
        ``poolAdmissionTargetMs``, waiters that can still get a first token within it go first:
        one predicted to miss it leaves a free slot to a later waiter that can make it, and is
        placed after them in the same pass, oldest first."""
        state = _Pass(int(getattr(self.node.settings.current, "poolAdmissionTargetMs", 0) or 0))
        order = self.ordered()
        first, late = target_order(order, self.served, state.target, self.speedup)
        for waiter in first:
            if not await self._try(waiter, state):
                late.append(waiter)
        state.target = 0
        for waiter in [w for w in order if w in late]:
            await self._try(waiter, state)

    async def _try(self, waiter: Waiter, state: _Pass) -> bool:
        """Place one waiter; False when it was left for later as predicted to miss the target."""
        node = self.node
        model = waiter.request.model
        if not self._still_waiting(waiter) or model in state.blocked:
            return True
        snapshot = await snapshot_of(node)
        if not self._still_waiting(waiter):
            return True
        # the same request placed again, its session source kept (affinity names it, and
        # X-Hub-Pool-Session is forwarded only when it came from that header)
        plan = await place(snapshot, replace(waiter.request, body=dict(waiter.request.body)))
        if not self._still_waiting(waiter):
            return True
        if isinstance(plan, NoAutoModel) or not plan.candidates:
            self._release(waiter, plan)  # answered as the walk would: the 502
            return True
        settings, engines = snapshot.settings, node.engine_by_kind
        ahead = state.held.get(model, 0)
        if saturated(plan, settings, engines, ahead):
            if has_free(plan, settings, engines):
                state.held[model] = ahead + 1  # waits for the full one; the next may take the free slot
            else:
                state.blocked.add(model)  # same-model waiters keep their order
            return True
        free_first(plan, settings, engines)
        first = plan.candidates[0]
        if state.target:
            predicted = predicted_ms(plan, first)
            if predicted is not None and waiter.waited_ms() * self.speedup + predicted > state.target:
                return False
        # reserved now, so the next waiter sees this slot taken; the walk's first attempt
        # counts it as its own (RelayPlan.reserved)
        node.load.acquire(first.peer_id, Work(first.backend, plan.model, plan.context.num_ctx,
                                              plan.context.judged) if first.is_local else None)
        self._release(waiter, plan)
        return True

    def _release(self, waiter: Waiter, plan: Any) -> None:
        self.leave(waiter)
        if isinstance(plan, Plan) and plan.candidates:
            self.served[waiter.key] = self.served.get(waiter.key, 0) + 1
            self.dispatched += 1
            self.wait_ms_total += waiter.waited_ms()
        if not waiter.ready.done():
            waiter.ready.set_result(plan)


def error_body(dialect: str, status: int, message: str) -> bytes:
    """The route's dialect: OpenAI's error object, the agent dialects' own, or the native
    ``{"error": "..."}``."""
    if dialect in AGENT_DIALECTS:
        code = "queue_full" if status == 429 else "queue_timeout"
        return json.dumps(dialect_error_body(dialect, status, message, code)).encode()
    if dialect == OPENAI:
        kind = "rate_limit_error" if status == 429 else "overloaded_error"
        code = "queue_full" if status == 429 else "queue_timeout"
        return json.dumps({"error": {"message": message, "type": kind, "code": code}}).encode()
    return json.dumps({"error": message}).encode()


def retry_after_s(queue: AdmissionQueue) -> int:
    """A hint for Retry-After: the mean wait so far, at least a second."""
    mean = queue.status()["meanWaitMs"] or 1000
    return max(1, math.ceil(mean / 1000))


class QueuedResponse:
    """The ASGI answer for a request that waits its turn: it waits inside the response (so it
    can watch the app hang up and send keep-alives), then relays as any placed request."""

    def __init__(self, node: Any, waiter: Waiter, row: dict[str, Any], budget_ms: int,
                 relay: Any, background: Any = None):
        self.node, self.waiter, self.row, self.budget_ms = node, waiter, row, budget_ms
        #: (plan, send_prefix_sent) -> an ASGI response relaying the placed request
        self.relay = relay
        self.background = background

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        node, waiter, row = self.node, self.waiter, self.row
        queue: AdmissionQueue = node.admission
        request = waiter.request
        keepalive = request.stream and request.dialect == OPENAI
        gone = asyncio.ensure_future(_disconnected(receive))
        started_stream = False
        deadline = time.monotonic() + self.budget_ms / 1000
        try:
            while True:
                timeout = deadline - time.monotonic()
                if keepalive:
                    first = waiter.enqueued + KEEPALIVE_AFTER_S
                    timeout = min(timeout, max(0.0, first - time.monotonic()) if not started_stream
                                  else KEEPALIVE_EVERY_S)
                pending: set[asyncio.Future[Any]] = {waiter.ready, gone}
                done, _ = await asyncio.wait(pending, timeout=max(0.0, timeout),
                                             return_when=asyncio.FIRST_COMPLETED)
                if waiter.ready in done:
                    break
                if gone in done:
                    queue.leave(waiter)
                    queue.abandoned += 1
                    waited = waiter.waited_ms()
                    node.routing_log.touch(row, outcome="failed", status=None, clientClosed=True, queuedMs=waited,
                                           durationMs=waited, totalMs=waited,
                                           reason=f"the app closed its connection after {waited} ms in the "
                                                  "admission queue; no node had been asked")
                    node.plugins.broadcast_request_finished(row)
                    return
                if time.monotonic() >= deadline:
                    queue.leave(waiter)
                    queue.expired += 1
                    await self._refuse(send, 503, f"Every node that serves {request.model} stayed busy for the "
                                                  f"request's {self.budget_ms} ms budget; retry later",
                                       started_stream)
                    return
                if keepalive:  # a comment line: SSE clients ignore it, proxies see traffic
                    if not started_stream:
                        await send({"type": "http.response.start", "status": 200, "headers": [
                            (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
                            (b"x-hub-pool-request-id", row["id"].encode())]})
                        started_stream = True
                    await send({"type": "http.response.body", "body": b": queued\n\n", "more_body": True})
        finally:
            gone.cancel()
        plan = waiter.ready.result()
        waited = waiter.waited_ms()
        node.routing_log.touch(row, queuedMs=waited)
        response = self.relay(plan, waited)
        await response(scope, receive, _AfterKeepalive(send) if started_stream else send)

    async def _refuse(self, send: Send, status: int, message: str, started_stream: bool) -> None:
        node, row, waiter = self.node, self.row, self.waiter
        waited = waiter.waited_ms()
        node.routing_log.touch(row, outcome="failed", status=status, queuedMs=waited, durationMs=waited,
                               totalMs=waited, reason=message[:200])
        node.plugins.broadcast_request_finished(row)
        retry = str(retry_after_s(node.admission)).encode()
        body = error_body(waiter.request.dialect, status, message)
        if started_stream:
            await send({"type": "http.response.body", "body": b"data: " + body + b"\n\n", "more_body": True})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
            return
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"retry-after", retry),
            (b"x-hub-pool-request-id", row["id"].encode()), (QUEUED_HEADER.lower().encode(), str(waited).encode())]})
        await send({"type": "http.response.body", "body": body, "more_body": False})


class _AfterKeepalive:
    """The relay's ASGI send once keep-alives committed a 200 SSE answer: its own start is
    dropped (a 200 stream's headers are already out); a failure's body becomes an SSE error
    frame, since the status can no longer change."""

    def __init__(self, send: Send):
        self.send = send
        self.failed = False

    async def __call__(self, message: Any) -> None:
        if message["type"] == "http.response.start":
            self.failed = message["status"] != 200
            return
        if self.failed:
            body = message.get("body", b"")
            if body:
                await self.send({"type": "http.response.body", "body": b"data: " + body.strip() + b"\n\n",
                                 "more_body": True})
            if not message.get("more_body", False):
                await self.send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
            return
        await self.send(message)


async def _disconnected(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
