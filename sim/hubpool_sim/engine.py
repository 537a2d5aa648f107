"""The engine's moving parts: slots, the prompt cache, model residency and the counters.

One :class:`Engine` per server. Handlers describe a request as a :class:`Generation`, hold a
slot for it with :meth:`Engine.serving` (queueing when every slot is busy, then paying load
and prefill time), and read its tokens from :meth:`Engine.decode` at the decode rate.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from hubpool_sim.config import SimConfig, SimModel
from hubpool_sim.faults import Fault, FaultBook, coerce_fault
from hubpool_sim.flavors import FLAVORS
from hubpool_sim.text import (
    UNUSED_TOKEN,
    common_prefix,
    continuation_point,
    count_tokens,
    loop_token,
    prose_token,
    token_text,
)

#: the shortest sleep a decode loop takes; shorter per-token delays are slept in batches
MIN_SLEEP_S = 0.004


async def silence() -> None:
    """Send nothing more and keep the connection open, until the client hangs up (the
    handler is cancelled then) or the server stops."""
    await asyncio.Event().wait()


@dataclass
class Generation:
    """One request's work: its prompt, how many tokens it will get, and what it cost.

    Without a ``max_tokens`` the model answers ``natural_tokens`` tokens and stops ("stop");
    with one it runs to exactly that limit ("length"), so a test asks for a long stream by
    asking for many tokens. A "cut" or "drop" fault stops it at half.

    ``continued`` is a trailing assistant message the request asks to continue: the answer
    goes on from where that text ends in it (llama-server, Ollama and vLLM continue such a
    message rather than start a new one), and a natural answer ends where it would have
    without the interruption. ``seed`` picks the "prose" answer (``prose``).
    """

    model: SimModel
    prompt: bytes
    natural_tokens: int
    max_tokens: int | None = None
    fault: Fault | None = None
    context: int = 0  # the window this request runs at (Ollama: options.num_ctx)
    cacheable: bool = True
    arrived: float = field(default_factory=time.monotonic)
    #: the engine's time_scale: waits are real seconds times this, reported durations are not
    scale: float = 1.0
    cached_tokens: int = 0
    load_s: float = 0.0
    prompt_s: float = 0.0
    decode_s: float = 0.0
    continued: str = ""
    seed: bytes = b""
    prose: bool = False

    def __post_init__(self) -> None:
        self.context = self.context or self.model.window
        self._offset, self._head = continuation_point(self.continued, self._full_token) if self.continued else (0, "")

    @property
    def prompt_tokens(self) -> int:
        """Tokens of prompt the engine keeps: Ollama truncates to its window, the others refuse first."""
        return min(count_tokens(self.prompt), self.context)

    @property
    def evaluated_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def planned_tokens(self) -> int:
        if self.max_tokens is not None:
            return max(1, self.max_tokens)
        return max(1, self.natural_tokens - self._offset)

    @property
    def kind(self) -> str | None:
        return self.fault.kind if self.fault else None

    @property
    def emitted_tokens(self) -> int:
        if self.kind in ("cut", "drop"):
            return max(1, self.planned_tokens // 2)
        return self.planned_tokens

    @property
    def finish_reason(self) -> str | None:
        """None for a cut answer: that is exactly what hubpool's output check looks for."""
        if self.kind in ("cut", "drop"):
            return None
        return "stop" if self.max_tokens is None else "length"

    def _full_token(self, index: int) -> str:
        if self.kind == "loop":
            return loop_token(index)
        if self.prose:
            return prose_token(self.seed, index)
        return token_text(index)

    def token(self, index: int) -> str:
        if self.kind == "unused":
            return UNUSED_TOKEN
        if index == 0 and self._head:
            return self._head
        return self._full_token(self._offset + index)

    def text(self) -> str:
        return "".join(self.token(i) for i in range(self.emitted_tokens))

    def total_s(self) -> float:
        """Seconds since arrival as the engine reports them (unscaled)."""
        return (time.monotonic() - self.arrived) / self.scale


@dataclass
class Slot:
    """One generation slot and the prompt its KV cache still holds."""

    id: int
    model: str | None = None
    prompt: bytes = b""
    busy: bool = False
    used_at: float = 0.0
    #: when the generation holding it is planned to end (monotonic, real seconds)
    busy_until: float = 0.0


class SlotPool:
    """At most ``size`` requests generate at once; the rest wait in arrival order.

    A free slot goes to the first waiter, and among free slots to the one whose cached prompt
    shares the longest prefix with the waiter's (llama-server's slot selection), else the
    least recently used, so one conversation does not evict another's cache.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.slots = [Slot(i) for i in range(size)]
        #: (handed a slot, model, prompt, answer tokens planned): the estimate plays them forward
        self._waiters: deque[tuple[asyncio.Future[Slot], str, bytes, int]] = deque()

    @property
    def in_flight(self) -> int:
        return sum(s.busy for s in self.slots)

    @property
    def queued(self) -> int:
        return sum(not fut.done() for fut, *_ in self._waiters)

    def models_in_flight(self) -> Counter[str]:
        return Counter(s.model for s in self.slots if s.busy and s.model)

    def models_queued(self) -> Counter[str]:
        return Counter(model for fut, model, *_ in self._waiters if not fut.done())

    async def acquire(self, model: str, prompt: bytes, answer_tokens: int) -> Slot:
        if not self._waiters:
            slot = self._pick(model, prompt)
            if slot is not None:
                return self._occupy(slot, model)
        waiter = (asyncio.get_running_loop().create_future(), model, prompt, answer_tokens)
        self._waiters.append(waiter)
        try:
            return await waiter[0]
        except asyncio.CancelledError:
            fut = waiter[0]
            if fut.done() and not fut.cancelled():  # a slot was handed over as the client left
                self.release(fut.result())
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def release(self, slot: Slot) -> None:
        slot.busy = False
        slot.used_at = time.monotonic()
        if slot.id >= self.size:  # retired by a resize while it was busy
            self.slots.remove(slot)
        self._hand_over()

    def resize(self, size: int) -> None:
        self.size = size
        have = {s.id for s in self.slots}
        self.slots.extend(Slot(i) for i in range(size) if i not in have)
        self.slots = [s for s in self.slots if s.id < size or s.busy]
        self._hand_over()

    def _occupy(self, slot: Slot, model: str) -> Slot:
        slot.busy = True
        if slot.model != model:
            slot.model, slot.prompt = model, b""
        return slot

    def _pick(self, model: str, prompt: bytes) -> Slot | None:
        idle = [s for s in self.slots if not s.busy and s.id < self.size]
        if not idle:
            return None
        return max(idle, key=lambda s: (common_prefix(s.prompt, prompt) if s.model == model else 0, -s.used_at))

    def _hand_over(self) -> None:
        while self._waiters:
            fut, model, prompt, _ = self._waiters[0]
            if fut.done():
                self._waiters.popleft()
                continue
            slot = self._pick(model, prompt)
            if slot is None:
                return
            self._waiters.popleft()
            fut.set_result(self._occupy(slot, model))


@dataclass
class Stats:
    """Counters behind GET /_sim/stats. Every request outside /_sim/ ends as exactly one of
    completed (answered in full, whatever the status), aborted (the client hung up first) or
    dropped (a "drop" fault cut the connection)."""

    requests: int = 0
    by_path: Counter[str] = field(default_factory=Counter)
    by_model: Counter[str] = field(default_factory=Counter)
    completed: int = 0
    aborted: int = 0
    dropped: int = 0
    faults_served: int = 0
    peak_in_flight: int = 0
    last_request: dict[str, Any] | None = None
    #: prompt tokens of the generations served, and the part the prompt cache held
    prompt_tokens: int = 0
    cached_tokens: int = 0


@dataclass
class Residency:
    context_length: int
    expires_at: float


class Engine:
    """State shared by every handler of one simulated engine."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.flavor = FLAVORS[config.flavor]
        self.faults = FaultBook()
        for item in config.faults:
            self.faults.add(coerce_fault(item))
        self.pool = SlotPool(config.slots)
        self.stats = Stats()
        self.started_at = time.time()
        self.resident: dict[str, Residency] = {}
        self.last_model: str | None = None
        self.tasks: set[asyncio.Task[Any]] = set()  # handlers running, so stop() can end hung ones
        #: stored Responses-API answers by id (the vllm flavor keeps them: previous_response_id)
        self.responses: dict[str, dict[str, Any]] = {}
        self.stopping = False
        for model_id in config.preloaded:
            model = config.find_model(model_id)
            if model is None:
                raise ValueError(f"preloaded model {model_id!r} is not one of the engine's models")
            self.mark_resident(model, model.window)

    # -- observation ------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        s = self.stats
        return {
            "flavor": self.flavor.name,
            "requests": s.requests,
            "by_path": dict(s.by_path),
            "by_model": dict(s.by_model),
            "in_flight": self.pool.in_flight,
            "queued": self.pool.queued,
            "peak_in_flight": s.peak_in_flight,
            "completed": s.completed,
            "aborted": s.aborted,
            "dropped": s.dropped,
            "faults_served": s.faults_served,
            "prompt_tokens": s.prompt_tokens,
            "cached_tokens": s.cached_tokens,
            "faults": self.faults.active(),
            "last_request": s.last_request,
        }

    def reset(self) -> None:
        self.stats = Stats()
        self.faults.clear()

    def flush(self) -> None:
        """Back to a cold start: every slot's prompt cache empty, only the preloaded models
        resident (a benchmark's next run starts where the last one did)."""
        for slot in self.pool.slots:
            slot.prompt, slot.model = b"", None
        self.resident.clear()
        self.last_model = None
        for model_id in self.config.preloaded:
            model = self.config.find_model(model_id)
            if model is not None:
                self.mark_resident(model, model.window)

    def configure(self, changes: dict[str, Any]) -> None:
        self.config.update(changes)
        if "slots" in changes:
            self.pool.resize(int(self.config.slots))

    # -- residency (Ollama's /api/ps, Lemonade's health) ------------------------------------
    def mark_resident(self, model: SimModel, context_length: int) -> None:
        self.resident[model.id] = Residency(context_length, time.time() + self.config.keep_alive_s)
        self.last_model = model.id

    def unload(self, model_id: str) -> None:
        self.resident.pop(model_id, None)
        if self.last_model == model_id:
            self.last_model = None

    def resident_models(self) -> list[tuple[SimModel, Residency]]:
        now = time.time()
        for model_id in [m for m, r in self.resident.items() if r.expires_at <= now]:
            self.unload(model_id)
        return [(m, self.resident[m.id]) for m in self.config.models if m.id in self.resident]

    # -- serving ----------------------------------------------------------------------------
    @asynccontextmanager
    async def serving(self, gen: Generation) -> AsyncIterator[Slot]:
        """Hold a slot for ``gen``: queue, then load the model if it is cold, then prefill.

        The prompt cache is read here: tokens shared with the slot's last prompt are reported
        as cached and skip prefill, and at least one token is always evaluated, as in
        llama-server.
        """
        slot = await self.pool.acquire(gen.model.id, gen.prompt if gen.cacheable else b"", gen.emitted_tokens)
        self.stats.peak_in_flight = max(self.stats.peak_in_flight, self.pool.in_flight)
        scale = gen.scale = self.config.time_scale
        try:
            if gen.cacheable:
                if self.config.prompt_cache and gen.prompt_tokens > 1:
                    shared = common_prefix(slot.prompt, gen.prompt) // 4
                    gen.cached_tokens = min(shared, gen.prompt_tokens - 1)
                slot.prompt = gen.prompt
                self.stats.prompt_tokens += gen.prompt_tokens
                self.stats.cached_tokens += gen.cached_tokens
            load = self.config.load_ms / 1000.0 if gen.model.id not in self.resident else 0.0
            prefill = self.config.prefill_s(gen.evaluated_tokens)
            planned = load + prefill + gen.emitted_tokens * self.config.token_delay_s
            slot.busy_until = time.monotonic() + planned * scale
            if load > 0:
                gen.load_s = load
                await asyncio.sleep(load * scale)
            self.mark_resident(gen.model, gen.context)
            if prefill:
                await asyncio.sleep(prefill * scale)
            # the prefill the simulated hardware took, as the load above: an engine times its own
            # compute, and this host's lateness waking the sleep is not the engine's. Read off the
            # wall, a 10 ms stall of a test process running at time_scale 0.1 made a 30 ms read
            # report an engine a third slower than its equal (tests/test_placement_mechanisms.py)
            gen.prompt_s = prefill
            yield slot
        finally:
            self.pool.release(slot)

    async def decode(self, gen: Generation, *, stall: bool = True) -> AsyncIterator[str]:
        """The answer's tokens, one every ``token_delay_s``. A "mute" generation goes silent
        before its first token and a "stall" one after half of them, the connection left
        open: both end only when the client hangs up (or the server stops). ``stall=False``:
        a streamed tool-call answer, which pays its time here and stalls inside its
        arguments instead (:func:`silence`)."""
        started = time.monotonic()
        owed = 0.0
        silent_at = {"mute": 0, "stall": max(1, gen.emitted_tokens // 2) if stall else None}.get(gen.kind or "")
        for index in range(gen.emitted_tokens):
            if index == silent_at:
                await silence()
            delay = self.config.token_delay_s * self.config.time_scale
            owed += delay
            # a scaled clock makes delays of a millisecond or less: those are slept in batches
            # (a timer per token would cost more CPU than the token), on schedule overall
            if delay and (owed >= MIN_SLEEP_S or self.config.time_scale == 1.0):
                await asyncio.sleep(owed)
                owed = 0.0
            yield gen.token(index)
        if owed:
            await asyncio.sleep(owed)
        gen.decode_s = (time.monotonic() - started) / self.config.time_scale
