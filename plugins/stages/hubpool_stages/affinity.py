"""Prefix affinity (spec: "Prefix affinity"; protocol.md §4b step 3).

A session is what the app names with ``X-Hub-Pool-Session``, else one SHA-256 over the
head of its prompt. The node and engine that last took the session are moved to the front
while their queue is under ``poolPrefixAffinityMaxInFlight`` (or within the margin). The
table is in memory only: 1,000 keys, least recently placed dropped first, entries expiring
``HUB_POOL_PREFIX_AFFINITY_TTL_MS`` after their last placement.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hubpool_core import Stage
from hubpool_core.config import parse_decimal
from hubpool_core.models_ids import fold_model_id
from hubpool_core.placement.prefixes import without_cache_marks
from hubpool_stages.contention import blocking_work, contention_on, reloaded_for_another_window

#: Most session keys held; the least recently placed is dropped first.
MAX_KEYS = 1000
#: How long an entry lives after its last placement, unless the environment says otherwise.
DEFAULT_TTL_MS = 600_000
#: The shortest TTL the environment may set (protocol.md §4a).
MIN_TTL_MS = 1000
#: The margin rule never qualifies an engine this deep (protocol.md §4a "affinity hard stop").
MARGIN_HARD_STOP = 20
TTL_ENV = "HUB_POOL_PREFIX_AFFINITY_TTL_MS"
HEADER = "X-Hub-Pool-Affinity"
#: Chat roles that make up the leading system prompt.
SYSTEM_ROLES = frozenset({"system", "developer"})

#: With predicted-TTFT ranking on, a remembered engine qualifies only while its prediction is
#: within this factor of the best candidate's, plus TTFT_MARGIN_MS (docs/placement.md).
TTFT_MARGIN = 1.5
TTFT_MARGIN_MS = 500
#: ctx.scratch keys this stage writes (read by its observers and by contention).
SCRATCH_KEY = "affinity_key"
SCRATCH_SESSION = "affinity_session"
SCRATCH_HOLD = "affinity_hold"
SCRATCH_SECTION = "affinity_section"
SCRATCH_REMEMBERED = "affinity_remembered"


def ttl_ms_from(environ: Mapping[str, str]) -> int:
    """``max(1000, HUB_POOL_PREFIX_AFFINITY_TTL_MS || 600_000)``: unset, zero or not a
    number is the default; anything below a second is a second."""
    # the core's one parser: ASCII digits only ("٣٠٠٠" or "1e4" is not a number of milliseconds)
    value = int(parse_decimal(environ.get(TTL_ENV)) or 0)
    return max(MIN_TTL_MS, value or DEFAULT_TTL_MS)


def prompt_head(route_class: str, body: Mapping[str, Any], route: str | None = None) -> Any | None:
    """The part of a body that names its session, or ``None`` when there is none.

    A chat body: the leading system message(s) and the first message after them, whole.
    A Messages body (``/v1/messages``): its ``system`` and first turn; a Responses body
    (``/v1/responses``): its ``instructions``, leading system/developer items and the first
    item after them. ``cache_control`` marks are left out: an agent moves them from turn to
    turn, and they say nothing about the prompt. A completion or generate body: its
    ``system`` and ``prompt`` fields, whole (it has no turn structure to stop at).
    """
    if route == "/v1/messages":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        return without_cache_marks({"system": body.get("system"), "first": messages[:1]})
    if route == "/v1/responses":
        items = body.get("input")
        if isinstance(items, list):
            cut = 0
            while cut < len(items) and _is_system(items[cut]):
                cut += 1
            items = items[:cut + 1]
        if not items and not body.get("instructions"):
            return None
        return {"instructions": body.get("instructions"), "first": items}
    if route_class == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        cut = 0
        while cut < len(messages) and _is_system(messages[cut]):
            cut += 1
        return messages[:cut + 1]
    system, prompt = body.get("system"), body.get("prompt")
    if not system and not prompt:
        return None
    return {"system": system, "prompt": prompt}


def _is_system(message: Any) -> bool:
    return isinstance(message, Mapping) and isinstance(message.get("role"), str) and message["role"] in SYSTEM_ROLES


def session_key(context: Any) -> tuple[str, str] | None:
    """``(kind, key)`` for a request: kind ``header`` when the app named its session (the
    X-Hub-Pool-Session header, or another configured source: ``context.session_source``),
    ``hashed`` when the key is the digest of the prompt head; ``None`` when there is
    neither (no header and a body with no head). The key is a hex SHA-256 and always
    includes the model, since a cache is per loaded model. Never logged.

    Cached in ``context.scratch`` so the core's residency look-up and the stage hash once.
    """
    cached = context.scratch.get(SCRATCH_SESSION)
    if cached is not None:
        return cached or None
    model = fold_model_id(context.model).encode("utf-8", "replace")
    digest = hashlib.sha256()
    if context.session_header:
        kind = "header"
        digest.update(b"header\0" + model + b"\0" + context.session_header.encode("utf-8", "replace"))
    else:
        head = prompt_head(context.route_class, context.body, getattr(context, "route", None))
        if head is None:
            context.scratch[SCRATCH_SESSION] = ()
            return None
        kind = "hashed"
        # spec: core-2 2026-09-21, six sessions behind one 25k-token prefix shared a 4 KB-window
        # key; the whole head is digested, every byte of it
        text = json.dumps(head, ensure_ascii=False, separators=(",", ":"), sort_keys=True, default=str)
        digest.update(b"hashed\0" + model + b"\0" + text.encode("utf-8", "surrogatepass"))
    found = (kind, digest.hexdigest())
    context.scratch[SCRATCH_SESSION] = found
    return found


class AffinityTable:
    """Session key -> (node, engine kind): where the key was last placed.

    At most ``capacity`` keys, least recently placed dropped first; an entry expires
    ``ttl_ms`` after it was written. ``clock`` is seconds, monotonic.
    """

    def __init__(self, ttl_ms: int, capacity: int = MAX_KEYS, clock: Callable[[], float] = time.monotonic):
        self.ttl_s = ttl_ms / 1000
        self.capacity = capacity
        self.clock = clock
        self._rows: OrderedDict[str, tuple[str, str, float, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, key: str) -> tuple[str, str] | None:
        """The (node, engine kind) remembered for ``key``, or ``None`` (never placed, or
        expired). Reading does not refresh an entry."""
        row = self._rows.get(key)
        if row is None:
            return None
        if self.clock() - row[2] >= self.ttl_s:
            del self._rows[key]
            return None
        return row[0], row[1]

    def tokens(self, key: str) -> int:
        """The prompt size (pool estimate) last placed under ``key``; 0 when not said."""
        row = self._rows.get(key)
        return row[3] if row is not None else 0

    def remember(self, key: str, node: str, backend: str, tokens: int = 0) -> None:
        """Write where ``key`` was placed now (and, when given, how long its prompt was);
        the oldest placement goes past capacity."""
        self._rows[key] = (node, backend, self.clock(), tokens)
        self._rows.move_to_end(key)
        while len(self._rows) > self.capacity:
            self._rows.popitem(last=False)

    def forget(self, key: str) -> None:
        """Drop ``key`` (its request failed on every candidate: the next call ranks fresh)."""
        self._rows.pop(key, None)


class PrefixAffinityStage(Stage):
    """Moves the node and engine that last took a session to the front while their queue
    is short enough that waiting beats a cold prefill.

    Section ``affinity``: ``{key, keySource, outcome, qualified, remembered, inFlight,
    leastLoadedInFlight, maxInFlight, affinityMargin}``; ``outcome`` is settled when the walk
    places its first candidate (:meth:`placed`), so a later stage that put another node
    first reads ``skipped``. Sets ``X-Hub-Pool-Affinity`` in ``context.response_headers``.
    """

    name = "prefix_affinity"
    section = "affinity"
    order = 100

    def __init__(self, node: Any = None) -> None:
        super().__init__(node)
        self.table = AffinityTable(ttl_ms_from(os.environ))

    def enabled(self, context: Any) -> bool:
        """On for the judged routes while ``poolPrefixAffinityMaxInFlight`` is above 0."""
        # spec: at 0 no prefix is hashed or remembered, ranking is byte for byte the old one
        return _limit(context) > 0 and bool(context.judged)

    def apply(self, ranking: Sequence[Any], context: Any) -> tuple[list[Any], dict[str, Any] | None]:
        """Move the remembered candidate to the front when it qualifies; write the section,
        the response header and the scratch entries the observers and contention read."""
        found = session_key(context)
        if found is None:
            return list(ranking), None
        kind, key = found
        context.scratch[SCRATCH_KEY] = key
        limit, margin = _limit(context), _margin(context)
        remembered = self.table.get(key)
        source = (getattr(context, "session_source", None) or "X-Hub-Pool-Session") if kind == "header" \
            else "prompt digest"
        section: dict[str, Any] = {"key": kind, "keySource": source, "outcome": "miss", "qualified": False,
                                   "remembered": remembered[0] if remembered else None, "inFlight": None,
                                   "leastLoadedInFlight": None, "maxInFlight": limit, "affinityMargin": margin}
        out = list(ranking)
        target = _find(out, remembered) if remembered else None
        if target is not None:
            context.scratch[SCRATCH_REMEMBERED] = remembered
            qualified, in_flight, least = self._qualifies(target, out, limit, margin)
            if qualified and not _within_prediction(context, target, out):
                qualified = False  # its node is no longer a good place: re-asked against the prediction
                section["ttftMargin"] = True
            if qualified:
                out = [target] + [c for c in out if c is not target]
                context.scratch[SCRATCH_HOLD] = (target.node, target.backend)
            section.update(qualified=qualified, inFlight=in_flight, leastLoadedInFlight=least,
                           outcome="hit" if out[0] is target else "skipped")
        context.scratch[SCRATCH_SECTION] = section
        context.response_headers[HEADER] = section["outcome"]
        return out, section

    def would_hold(self, ranking: Sequence[Any], context: Any) -> tuple[str, str] | None:
        """The (node, engine kind) :meth:`apply` would qualify for this request, without
        writing anything but the cached key; ``None`` when it would hold nothing. Lets the
        core decide, before the stages run, whether a residency read is worth its budget."""
        if not self.enabled(context):
            return None
        found = session_key(context)
        remembered = self.table.get(found[1]) if found else None
        target = _find(ranking, remembered) if remembered else None
        if target is None or not self._qualifies(target, ranking, _limit(context), _margin(context))[0] \
                or not _within_prediction(context, target, ranking):
            return None
        return target.node, target.backend

    def wants_residency(self, ranking: Sequence[Any], context: Any) -> list[str]:
        """Engine kinds whose residency the core should read into
        ``context.scratch["resident"]`` before the stages run (within the 500 ms placement
        budget; a read that fails, cannot tell or is late is stored as ``None``).

        Only what contention's exemption needs: the local engine this session would be held
        on, while contention is on, a peer could take the request, the engine is busy with
        work the request cannot join, the model is not generating there at another window,
        and the engine can tell residency at all. Usually empty: no I/O is asked for then.
        """
        hold = self.would_hold(ranking, context)
        if hold is None or hold[0] != "local" or not contention_on(os.environ):
            return []
        if all(c.is_local for c in ranking):
            return []
        cand = next(c for c in ranking if c.is_local and c.backend == hold[1])
        load = getattr(self.node, "load", None)
        if load is None or not getattr(cand.local.engine, "has_residency", False):
            return []
        if not blocking_work(cand, context, load) or reloaded_for_another_window(cand, context, load):
            return []
        return [cand.backend]

    # -- the walk ---------------------------------------------------------------------
    def placed(self, context: Any, candidate: Any) -> None:
        """Settle the outcome against the candidate the walk tries first, and remember it:
        written at placement, so a parallel call follows to the engine already prefilling."""
        key = context.scratch.get(SCRATCH_KEY)
        if key is None:
            return
        section = context.scratch.get(SCRATCH_SECTION)
        remembered = context.scratch.get(SCRATCH_REMEMBERED)
        if section is not None and remembered is not None:  # remembered and a candidate
            section["outcome"] = "hit" if remembered == (candidate.node, candidate.backend) else "skipped"
            context.response_headers[HEADER] = section["outcome"]
        self.table.remember(key, candidate.node, candidate.backend)

    def failed_over(self, context: Any, candidate: Any) -> None:
        """The candidate that actually took the work overwrites the entry."""
        key = context.scratch.get(SCRATCH_KEY)
        if key is not None:
            self.table.remember(key, candidate.node, candidate.backend)

    def exhausted(self, context: Any) -> None:
        """Every candidate failed: forget the session so its next call ranks fresh."""
        key = context.scratch.get(SCRATCH_KEY)
        if key is not None:
            self.table.forget(key)

    def _qualifies(self, target: Any, ranking: Sequence[Any], limit: int, margin: int) -> tuple[bool, int, int | None]:
        """(qualified, its queue, the least-loaded other candidate's queue or None)."""
        in_flight = self._in_flight(target)
        others = [self._in_flight(c) for c in ranking if c is not target]
        least = min(others) if others else None
        # spec: the margin only widens a limit that is on, and stops at the hard stop of 20
        by_margin = margin > 0 and least is not None and in_flight <= least + margin and in_flight < MARGIN_HARD_STOP
        return in_flight < limit or by_margin, in_flight, least

    def _in_flight(self, candidate: Any) -> int:
        """A candidate's queue: this node's own count for a local engine, else the ranker's."""
        load = getattr(self.node, "load", None)
        if candidate.is_local and load is not None:
            return load.local
        return candidate.in_flight


def _within_prediction(context: Any, target: Any, ranking: Sequence[Any]) -> bool:
    """Whether the remembered engine's predicted time to first token (the predicted-TTFT
    stage's, which counts the prefix it holds) is within the margin of the best candidate's;
    true when either has no prediction (the stage off, or no evidence)."""
    table = context.scratch.get("ttft_predicted")
    if not isinstance(table, dict):
        return True
    mine = table.get(id(target))
    best = min((v for c in ranking if (v := table.get(id(c))) is not None), default=None)
    if mine is None or best is None:
        return True
    return mine <= best * TTFT_MARGIN + TTFT_MARGIN_MS


def _find(ranking: Sequence[Any], remembered: tuple[str, str]) -> Any | None:
    for cand in ranking:
        if (cand.node, cand.backend) == remembered:
            return cand
    return None


def _limit(context: Any) -> int:
    return int(getattr(context.settings, "poolPrefixAffinityMaxInFlight", 0) or 0)


def _margin(context: Any) -> int:
    return int(getattr(context.settings, "poolPrefixAffinityMargin", 0) or 0)
