"""When each engine's next slot frees (hubpool's own; docs/placement.md, "What is left of the
work in flight").

Two full engines with two requests each wait alike by count, and not at all alike by what those
requests have left. The node in front of an engine relays every request the engine runs, so it
knows when each began, the prompt it read, the answer it asked for and when its first token came.
With the engine's measured speed it plays that work forward, first in first served, to the moment
each slot frees. Its own placement reads the schedule for its engines; its peers read it from
capabilities (``slotsFree``, the busy load poll) and from ``X-Hub-Pool-Slots-Free-Ms`` on every
answer it serves them, aged by the time since. In memory only; pure bookkeeping, no I/O.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

from hubpool_core.config import whole_in_range
from hubpool_core.engine import answer_limit

#: the header a node serving a peer's forward names its engine's schedule in (ms, comma-separated)
FREE_HEADER = "x-hub-pool-slots-free-ms"
#: slots one schedule lists at most (a peer's longer list is cut; the soonest come first)
MAX_SLOTS = 64
#: the longest wait one slot can state (an hour): a larger figure is a bad value, not a plan
MAX_FREE_MS = 3_600_000
#: a request past its plan, when the engine has no mean service time, is taken to have this share
#: of its plan left (it has not ended, and by how much it overruns nothing says)
OVERRUN = 0.1
#: an answer's asked ceiling counts as its plan up to this many times the engine's typical
#: answer, or ANSWER_PLAN_TOKENS; beyond, it is a ceiling (an agent asks 32,000 and stops at a
#: few hundred), and the typical answer is the plan
ANSWER_CEILING = 4.0
ANSWER_PLAN_TOKENS = 1024


def asked_answer_tokens(body: Any) -> int | None:
    """The answer length a request asks for in any dialect (:func:`hubpool_core.engine.answer_limit`),
    ``None`` when it names none."""
    found = answer_limit(body)
    return None if found is None else found[2]


def planned_answer_ms(speed: Any, asked: int | None) -> float | None:
    """How long the answer is expected to decode: the tokens it asks for (or, for a ceiling far
    above what this engine's answers run, their typical length) at the engine's decode rate."""
    per_token = getattr(speed, "decode_ms_per_token", None)
    typical = getattr(speed, "answer_tokens", None)
    if per_token is None:
        return None
    planned = asked is not None and (typical is None or asked <= max(ANSWER_CEILING * typical, ANSWER_PLAN_TOKENS))
    tokens = asked if planned else typical
    return None if tokens is None else tokens * per_token


def planned_work(speed: Any, tokens: int, before_ms: float | None, body: Any) -> tuple[float | None, float | None]:
    """(how long a request is expected to hold its slot, how long to decode) on an engine of
    ``speed``. ``before_ms`` is the prefill (and load) placement predicted for it, cached prefix
    counted; ``None`` reads the whole prompt at the measured rate. Without a decode rate (an
    engine that reports no timings) neither is known, and the engine has no schedule."""
    if speed is None:
        return None, None
    answer = planned_answer_ms(speed, asked_answer_tokens(body))
    before = before_ms
    if before is None and speed.prefill_tps:
        before = tokens / speed.prefill_tps * 1000.0
    if answer is not None and before is not None:
        return before + answer, answer
    return None, answer


class Running:
    """One request on a local engine: when it was handed over, how long it is expected to hold its
    slot (``planned_ms``: prefill and answer) and to decode (``answer_ms``), and when its first
    token came (``decoding_at``); ``None`` is unknown."""

    __slots__ = ("kind", "started", "planned_ms", "answer_ms", "mean_ms", "decoding_at", "_clock")

    def __init__(self, kind: str, started: float, planned_ms: float | None, answer_ms: float | None,
                 clock: Callable[[], float], mean_ms: float | None = None) -> None:
        self.kind = kind
        self.started = started
        self.planned_ms = planned_ms
        self.answer_ms = answer_ms
        #: the engine's mean service time when it began: what a request past its plan has left
        self.mean_ms = mean_ms
        self.decoding_at: float | None = None
        self._clock = clock

    def first_token(self) -> None:
        """The first token reached the relay: the prompt is read, the answer is under way."""
        if self.decoding_at is None:
            self.decoding_at = self._clock()

    def left_ms(self, now: float) -> float | None:
        """What it has left if it holds a slot now; ``None`` without a plan (the count then prices
        the wait, as it always did). Past its plan it has run longer than planned (an answer longer
        than typical, a slower engine) and what is left is unknown: it is priced at the engine's
        mean service time."""
        if self.decoding_at is not None and self.answer_ms is not None:
            plan, left = self.answer_ms, self.answer_ms - (now - self.decoding_at) * 1000
        elif self.planned_ms is not None:
            plan, left = self.planned_ms, self.planned_ms - (now - self.started) * 1000
        else:
            return None
        if left > 0:
            return left
        return self.mean_ms if self.mean_ms is not None else OVERRUN * plan


def engine_clock(speedup: int = 1) -> Callable[[], float]:
    """Seconds on the engines' clock: HUB_POOL_DEV_CLOCK_SPEEDUP times the wall's in a bench rig
    whose engines run faster (their timings, and so every plan, are on their clock); 1 elsewhere."""
    if speedup <= 1:
        return time.monotonic
    return lambda: time.monotonic() * speedup


class SlotClock:
    """The requests this node has on each local engine, in the order it handed them over."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._work: dict[str, list[Running]] = {}

    def start(self, kind: str, planned_ms: float | None, answer_ms: float | None,
              mean_ms: float | None = None) -> Running:
        entry = Running(kind, self.clock(), planned_ms, answer_ms, self.clock, mean_ms)
        self._work.setdefault(kind, []).append(entry)
        return entry

    def finish(self, entry: Running) -> None:
        work = self._work.get(entry.kind)
        if work is not None:
            try:
                work.remove(entry)
            except ValueError:
                pass
            if not work:
                del self._work[entry.kind]

    def total(self) -> int:
        """Requests tracked on every local engine."""
        return sum(len(w) for w in self._work.values())

    def free_in(self, kind: str, slots: int) -> list[float] | None:
        """Milliseconds until each of the engine's ``slots`` frees once the work this node handed
        it has had its turn, soonest first; ``None`` when a request's length is unknown. The first
        ``slots`` requests hold a slot; each later one takes the first slot to free, for its whole
        plan (first in, first served, as llama-server and Ollama queue)."""
        now = self.clock()
        work = self._work.get(kind, [])
        free = [0.0] * max(1, slots)
        for i, entry in enumerate(work):
            if i < len(free):
                left = entry.left_ms(now)
                if left is None:
                    return None
                free[i] = left
                continue
            if entry.planned_ms is None:
                return None
            if i == len(free):
                heapq.heapify(free)
            heapq.heapreplace(free, free[0] + entry.planned_ms)
        return sorted(free)

    def header_value(self, kind: str, slots: int | None) -> str | None:
        """The schedule as ``X-Hub-Pool-Slots-Free-Ms`` carries it; ``None`` when unknown."""
        free = self.free_in(kind, slots) if slots else None
        return None if free is None else ",".join(str(v) for v in stated_ms(free))


def stated_ms(free: list[float]) -> list[int]:
    """A schedule in whole milliseconds as a peer is told it (header and capabilities), at most
    :data:`MAX_SLOTS`: a busy slot is at least 1, because a peer reads 0 as free until its count
    says otherwise (rounded, a slot 0.3 ms from its plan's end read as free for good); none above
    :data:`MAX_FREE_MS`, which a peer refuses."""
    return [min(MAX_FREE_MS, math.ceil(v)) if v > 0 else 0 for v in free[:MAX_SLOTS]]


def with_more(free: list[float], more: int, service_ms: float | None) -> float | None:
    """The wait for a slot once ``more`` requests of ``service_ms`` each have queued ahead of
    this one on the schedule ``free`` (ms, any order); ``None`` when they must be priced and
    nothing says for how long."""
    if not free:
        return None
    if more <= 0:
        return min(free)
    if service_ms is None:
        return None
    heap = list(free)
    heapq.heapify(heap)
    for _ in range(min(more, 10_000)):
        heapq.heapreplace(heap, heap[0] + service_ms)
    return heap[0]


def parse_free(values: Iterable[Any]) -> list[float] | None:
    """A peer's schedule, validated: at most :data:`MAX_SLOTS` finite numbers from 0 to
    :data:`MAX_FREE_MS`; anything else makes the whole list unsaid."""
    out: list[float] = []
    for i, value in enumerate(values):
        if i >= MAX_SLOTS:
            break
        if isinstance(value, str):
            value = whole_in_range(value, 0, MAX_FREE_MS)
            if value is None:
                return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not 0 <= value <= MAX_FREE_MS:
            return None
        out.append(float(value))
    return out or None


class PeerSlots:
    """Each peer engine's schedule as the peer last stated it, beside its in-flight count then and
    when it arrived: read back aged by the time since, with the requests the count gained since
    queued on it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._said: dict[tuple[str, str], tuple[list[float], int, float]] = {}

    def note(self, peer_id: str, backend: str, free: list[float] | None, in_flight: int) -> None:
        if free is None:
            self._said.pop((peer_id, backend), None)
        elif len(self._said) < 4096 or (peer_id, backend) in self._said:
            self._said[(peer_id, backend)] = (free, in_flight, self.clock())

    def note_capabilities(self, peer_id: str, capabilities: Any) -> None:
        """Every engine's schedule in a capabilities answer (``slotsFree: [{backend, ms}]``)."""
        if not isinstance(capabilities, dict):
            return
        count = capabilities.get("inFlightRequests")
        entries = capabilities.get("slotsFree")
        if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= 1_000_000 \
                or not isinstance(entries, list):
            return
        for entry in entries[:32]:
            if isinstance(entry, dict) and isinstance(entry.get("backend"), str) and isinstance(entry.get("ms"), list):
                self.note(peer_id, entry["backend"][:40], parse_free(entry["ms"]), count)

    def forget(self, peer_id: str) -> None:
        for key in [k for k in self._said if k[0] == peer_id]:
            del self._said[key]

    def stated(self, peer_id: str, backend: str, overrun_ms: float | None = None) -> tuple[list[float], int] | None:
        """The schedule aged to now, and the peer's in-flight count when it was stated. A slot
        that was busy when stated and whose time has passed since is overrunning, as far as this
        node knows (its count has not fallen yet): it is priced at ``overrun_ms`` (the engine's
        mean service time, as the peer prices its own overruns), else as free. A slot stated
        free stays free; requests sent there since are the count's to add."""
        said = self._said.get((peer_id, backend))
        if said is None:
            return None
        free, count, at = said
        gone = (self.clock() - at) * 1000
        aged = [v - gone if v - gone > 0 or v == 0 else (overrun_ms or 0.0) for v in free]
        return [max(0.0, v) for v in aged], count
