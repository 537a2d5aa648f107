"""Queue depth as the proxy counts it: the load the base ranker orders candidates by
(spec: Ranking). In memory only; the relay acquires and releases, placement reads."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

#: what an unmeasured peer counts as: never idle
UNKNOWN_PEER_LOAD = 1


class Work(NamedTuple):
    """What one request puts on a local engine: the engine's kind, the model and the window it
    asked for, and whether it generates (a chat or a completion; an embedding, a rerank or a
    token count does not). Contention reads generations only (spec: "Local engine contention")."""

    kind: str
    model: str
    num_ctx: int | None
    generation: bool = True


class Load:
    """Queue depth as the proxy counts it: requests handed to an engine and not finished.

    A peer's depth is what this node forwarded it and has not finished reading, plus what
    its last snapshot counted beyond this node's own forwards at that moment.
    """

    def __init__(self) -> None:
        self.local = 0
        self.forwarded: dict[str, int] = {}
        self._forwarded_at_report: dict[str, int] = {}
        #: peer id -> (in flight it reported on its last forwarded answer, what this node had
        #: forwarded it then, when): fresher than a poll for the peers this node talks to
        self._fresh: dict[str, tuple[int, int, float]] = {}
        self._report_at: dict[str, float] = {}
        #: called after every release, and when a peer's fresh count falls (the admission
        #: queue's wake-up); None: nobody listens
        self.on_release: Callable[[], None] | None = None
        #: generations in flight on each local engine: engine kind -> {(model, num_ctx): count}
        self.local_work: dict[str, dict[tuple[str, int | None], int]] = {}
        #: this node's other work in flight on each local engine (embeddings and the like):
        #: engine kind -> count; not contention, but still this node's own on that engine
        self.local_other: dict[str, int] = {}
        #: when this node last handed a request to an engine (monotonic): "busy" lasts a while
        self.last_acquired = 0.0
        #: whether requests wait in the admission queue (set by the queue); None: no queue
        self.waiting: Callable[[], bool] | None = None

    def acquire(self, peer_id: str | None, work: Work | tuple[str, str, int | None] | None = None) -> None:
        """Count a request handed to an engine. ``work`` is what it puts on a local engine
        (:class:`Work`; a bare (kind, model, num_ctx) is a generation), so contention can
        tell what that engine is generating."""
        self.last_acquired = time.monotonic()
        if peer_id is None:
            self.local += 1
            if work is not None:
                self._note(work, 1)
        else:
            self.forwarded[peer_id] = self.forwarded.get(peer_id, 0) + 1

    def release(self, peer_id: str | None, work: Work | tuple[str, str, int | None] | None = None) -> None:
        if peer_id is None:
            self.local = max(0, self.local - 1)
            if work is not None:
                self._note(work, -1)
        else:
            self.forwarded[peer_id] = max(0, self.forwarded.get(peer_id, 0) - 1)
        if self.on_release is not None:
            self.on_release()

    def busy(self, within_s: float) -> bool:
        """Work in flight here or at a peer, a request placed in the last ``within_s``, or
        requests waiting in the admission queue for a slot to free (at a peer too)."""
        return self.local > 0 or any(self.forwarded.values()) or time.monotonic() - self.last_acquired < within_s \
            or (self.waiting is not None and self.waiting())

    def _note(self, work: Work | tuple[str, str, int | None], step: int) -> None:
        """Add ``step`` to what ``work`` counts in: a generation by (model, window), any other
        work by engine alone; an entry that reaches 0 goes."""
        kind = work[0]
        counts: dict[Any, int]
        key: Any
        if not isinstance(work, Work) or work.generation:
            counts, key = self.local_work.setdefault(kind, {}), (work[1], work[2])
        else:
            counts, key = self.local_other, kind
        left = counts.get(key, 0) + step
        if left > 0:
            counts[key] = left
        else:
            counts.pop(key, None)

    def engine_external(self, kind: str, reported: int | None) -> int:
        """What a local engine reported running or waiting beyond this node's own requests
        on it: work that reached it directly. 0 when it reported nothing (the setting off,
        or an engine with no such figure), so the proxy's count stands alone."""
        if reported is None:
            return 0
        ours = sum(self.local_work.get(kind, {}).values()) + self.local_other.get(kind, 0)
        return max(0, reported - ours)

    def note_report(self, peer_id: str) -> None:
        """Called when a peer's snapshot arrives: what we had forwarded at that moment."""
        self._forwarded_at_report[peer_id] = self.forwarded.get(peer_id, 0)
        self._report_at[peer_id] = time.monotonic()

    def note_fresh(self, peer_id: str, in_flight: int) -> None:
        """A forwarded answer's ``X-Hub-Pool-In-Flight``, or the busy load poll's answer: the
        peer's own count as it answered (a forward's own request included), beside what this
        node had forwarded it then. A count that fell (work this node did not send finished
        there) wakes the admission queue, as a release here does."""
        before = self._fresh.get(peer_id)
        forwarded = self.forwarded.get(peer_id, 0)
        self._fresh[peer_id] = (in_flight, forwarded, time.monotonic())
        if before is not None and in_flight - forwarded < before[0] - before[1] and self.on_release is not None:
            self.on_release()

    def peer_load(self, peer_id: str, reported: int | None) -> int:
        forwarded = self.forwarded.get(peer_id, 0)
        if reported is None:
            return max(forwarded, UNKNOWN_PEER_LOAD)  # unmeasured is never idle
        fresh = self._fresh.get(peer_id)
        if fresh is not None and fresh[2] > self._report_at.get(peer_id, 0.0):
            return forwarded + max(0, fresh[0] - fresh[1])  # milliseconds old, not a poll old
        external = max(0, reported - self._forwarded_at_report.get(peer_id, 0))
        return forwarded + external
