"""Predicted time to first token as the ranking (order 50, before affinity; hubpool's own
departure from the spec's queue-depth ranking, docs/placement.md).

The spec orders candidates by queue depth, so a 1-slot box ten times slower with nothing in
flight outranks a 4-slot box with two. This stage predicts, per candidate, the time to a
first token: the queue wait its in-flight work leaves (in flight beyond its known slots,
times how long a request holds a slot, over the slots), the prefill of the part of the
prompt its engine does not already hold (the node that last took this session holds the
session's previous prompt), and the model load when its engine says the model is not in
memory. It applies to every prompt size.

A busy engine whose slot count nothing states is priced as one slot (its work in flight
ahead of this request). Where a candidate has no evidence (no measured speed, or in flight
with no measured service time) it keeps its queue-depth place: the candidates with a
prediction are ordered among the places they hold, and the others do not move, so an
unmeasured node is explored as today.
``poolTtftRanking`` 0 turns the stage off: the ranking is then the spec's exactly. So does
the spec's own switch for measured speed, ``HUB_POOL_THROUGHPUT_PLACEMENT=off`` (issue 26
item 17): a prediction is measured speed reordering candidates. Off, the stage is not called
and hashes nothing; on, it reads the session's key only when there are candidates to order.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from hubpool_core import Stage
from hubpool_core.placement.prefixes import PrefixIndex, block_chain, prompt_bytes
from hubpool_core.placement.slot_clock import with_more
from hubpool_core.placement.speed import (
    DEFAULT_LOAD_MS,
    SCRATCH_BEFORE,
    SCRATCH_PREDICTED,
    SCRATCH_SLOT_MS,
    SCRATCH_WAIT,
    advertised_prior,
    advertised_residency,
    advertised_speed,
    candidate_slots,
    merged,
)
from hubpool_stages.affinity import AffinityTable, session_key, ttl_ms_from
from hubpool_stages.throughput import throughput_on

#: ctx.scratch keys written here (beside the core's SCRATCH_PREDICTED and SCRATCH_SLOT_MS)
SCRATCH_KEY = "ttft_session"
SCRATCH_CHAIN = "ttft_chain"
#: the engine the walk last tried with this request's chain remembered
SCRATCH_TRIED = "ttft_tried"
#: predictions this close to the best one are a tie that spreading sessions settles: 10 % of the
#: best, and at least SPREAD_TIE_MS (two engines of one speed with free slots predict alike)
SPREAD_TIE = 0.1
SPREAD_TIE_MS = 250
#: a prompt shorter than this is not spread: it re-reads in milliseconds on any engine, so keeping
#: sessions' caches apart gains it nothing and the prediction (its hop included) decides
#: (the spec's figure under which a read times fixed costs rather than the hardware)
SPREAD_MIN_TOKENS = 1024


def ranking_on(context: Any) -> bool:
    """``poolTtftRanking`` 1 and measured speed allowed to reorder (``HUB_POOL_THROUGHPUT_PLACEMENT``
    not off: the spec's switch covers every reordering by measured speed, this one included)."""
    return int(getattr(context.settings, "poolTtftRanking", 0) or 0) > 0 and throughput_on()


class PredictedTtftStage(Stage):
    """Orders the candidates that have evidence by predicted time to first token.

    Section ``ttft`` (``None`` when fewer than two candidates have a prediction):
    ``{estimatedTokens, predictions: [{node, backend, predictedMs, waitMs, prefillMs, loadMs,
    hopMs, cachedTokens, inFlight, slots, waitBasis}], unmeasured: [node], moved}``; ``moved`` is
    whether the order differs from the queue-depth one; ``waitBasis`` says what priced a full
    engine's wait (``schedule``: when its slots free; ``count``: its count times the mean service;
    ``None``: a slot is free).
    """

    name = "predicted_ttft"
    section = "ttft"
    order = 50

    def __init__(self, node: Any = None) -> None:
        super().__init__(node)
        #: where each session's prompt was last placed, and how long it was: that engine holds it
        self.holders = AffinityTable(ttl_ms_from(os.environ))
        #: what each engine was sent, by blocks (poolPrefixIndex): which prefix it holds
        self.prefixes = PrefixIndex(ttl_ms_from(os.environ) / 1000)

    def enabled(self, context: Any) -> bool:
        """On while ``poolTtftRanking`` is 1 and ``HUB_POOL_THROUGHPUT_PLACEMENT`` is not off, on
        the routes that take a slot (not ``show``)."""
        return ranking_on(context) and context.route_class != "show"

    # -- the evidence ------------------------------------------------------------------
    def slots_of(self, candidate: Any, context: Any) -> int | None:
        """Requests the candidate's engine runs at once (reported, else stated)."""
        return candidate_slots(candidate, context.settings, getattr(self.node, "engine_by_kind", None) or {})

    def speed_of(self, candidate: Any, model: str) -> Any:
        """This engine's measured speed for the model; for a model it never served, the node's
        speed on another (a prior: the first request is then priced, a cold load included)."""
        book = getattr(self.node, "speed", None)
        observed = book.get(candidate.node, candidate.backend, model) if book is not None else None
        caps = None if candidate.is_local else getattr(candidate.peer, "last_capabilities", None)
        speed = observed if candidate.is_local else merged(observed, advertised_speed(caps, candidate.backend, model))
        if speed is not None and speed.prefill_tps is not None:
            return speed
        prior = book.node_prior(candidate.node) if book is not None else None
        return prior if prior is not None or candidate.is_local else advertised_prior(caps)

    def resident(self, candidate: Any, model: str) -> bool | None:
        """Whether the candidate's engine holds the model: a local engine as its residency reads
        say; a peer's as it advertises, unless this node saw it serve the model after that
        advertisement was taken (an engine that loaded it for us holds it until its next read
        says otherwise: Ollama unloads after its keep-alive)."""
        view = getattr(self.node, "residency", None)
        known = view.resident(candidate.node, candidate.backend, model) if view is not None else None
        if candidate.is_local:
            return known
        models = advertised_residency(getattr(candidate.peer, "last_capabilities", None), candidate.backend)
        if models is None:
            return known
        from hubpool_core.placement import same_model

        if any(same_model(m, model) for m in models):
            return True
        seen = view.served_at(candidate.node, candidate.backend, model) if view is not None else None
        reported = getattr(candidate.peer, "last_seen_at", None)
        return seen is not None and (reported is None or seen > reported.timestamp())

    def predict(self, candidate: Any, context: Any, cached: int,
                cached_queued: int | None = None) -> dict[str, Any] | None:
        """The prediction's parts for one candidate, or ``None`` without evidence. ``cached`` is
        what its engine holds of the prompt; ``cached_queued`` what it still holds once the request
        has waited for a slot (``None``: the same)."""
        speed = self.speed_of(candidate, context.model)
        if speed is None or speed.prefill_tps is None:
            return None
        slots = self.slots_of(candidate, context)
        in_flight = candidate.in_flight
        # a busy engine whose concurrency nothing states is priced as one slot: the longest its
        # work in flight can hold this request back (a warm node's queue against a cold load)
        per = slots or 1
        wait, basis = 0.0, None
        if in_flight >= per:
            # every slot is busy: the one this request gets holds the prompt that ran in it, so
            # only a head other prompts share is still there (docs/placement.md, "A full engine's
            # cache")
            if cached_queued is not None:
                cached = min(cached, cached_queued)
            scheduled = self.scheduled_wait(candidate, per, in_flight, speed.service_ms)
            if scheduled is not None:
                wait, basis = scheduled, "schedule"
            elif speed.service_ms is None:
                return None  # busy, and nothing says for how long
            else:
                wait, basis = (in_flight - per + 1) * speed.service_ms / per, "count"
        tokens = max(0, context.estimated_tokens - cached)
        prefill = tokens / speed.prefill_tps * 1000.0
        resident = self.resident(candidate, context.model)
        load = 0.0 if resident is not False else (speed.load_ms or DEFAULT_LOAD_MS)
        hops = getattr(self.node, "hops", None)
        hop = hops.engine_ms(candidate.peer_id) if hops is not None else 0.0
        return {"node": candidate.node, "backend": candidate.backend,
                "predictedMs": round(wait + prefill + load + hop),
                "waitMs": round(wait), "prefillMs": round(prefill), "loadMs": round(load), "hopMs": round(hop),
                "cachedTokens": cached, "inFlight": in_flight, "slots": slots, "waitBasis": basis,
                "_slotMs": None if speed.service_ms is None else speed.service_ms / per,
                "_beforeMs": prefill + load}

    def scheduled_wait(self, candidate: Any, slots: int, in_flight: int, service_ms: float | None) -> float | None:
        """The wait for a slot as the engine's schedule says (when each slot frees once the work
        in flight has had its turn: hubpool_core/placement/slot_clock.py), with the requests the
        count holds beyond what the schedule saw queued on it at the mean service time; ``None``
        when there is no schedule. A local engine's is this node's own clock; a peer's is what it
        last stated, aged."""
        if candidate.is_local:
            clock = getattr(self.node, "slot_clock", None)
            free = clock.free_in(candidate.backend, slots) if clock is not None else None
            seen = clock.total() if clock is not None else 0
        else:
            book = getattr(self.node, "peer_slots", None)
            stated = book.stated(candidate.peer_id, candidate.backend, service_ms) if book is not None else None
            free, seen = stated if stated is not None else (None, 0)
        return None if free is None else with_more(free, in_flight - seen, service_ms)

    # -- the stage ---------------------------------------------------------------------
    def apply(self, ranking: Sequence[Any], context: Any) -> tuple[list[Any], dict[str, Any] | None]:
        out = list(ranking)
        holder = None
        # one candidate has nothing to be ordered against: no prompt head is hashed for it
        found = session_key(context) if context.judged and len(out) > 1 else None
        if found is not None:
            context.scratch[SCRATCH_KEY] = found[1]
            holder = self.holders.get(found[1])
        held_tokens = self.holders.tokens(found[1]) if found is not None and holder is not None else 0
        chain: tuple[bytes, ...] = ()
        if _on(context, "poolPrefixIndex") and context.judged and len(out) > 1:
            chain = block_chain(prompt_bytes(context.body), context.model)
            context.scratch[SCRATCH_CHAIN] = chain
        predictions: dict[int, dict[str, Any] | None] = {}
        head: int | None = None
        for cand in out:
            cached = min(held_tokens, context.estimated_tokens) if holder == (cand.node, cand.backend) else 0
            if chain:
                cached = max(cached, min(self.prefixes.held_tokens(cand.node, cand.backend, chain),
                                         context.estimated_tokens))
            if cached and head is None:
                head = self.prefixes.shared_head(chain) if chain else 0
            predictions[id(cand)] = self.predict(cand, context, cached, head)
        context.scratch[SCRATCH_PREDICTED] = {k: (v["predictedMs"] if v else None) for k, v in predictions.items()}
        context.scratch[SCRATCH_SLOT_MS] = {k: (v.pop("_slotMs") if v else None) for k, v in predictions.items()}
        context.scratch[SCRATCH_BEFORE] = {k: (v.pop("_beforeMs") if v else None) for k, v in predictions.items()}
        context.scratch[SCRATCH_WAIT] = {k: (v["waitMs"] if v else None) for k, v in predictions.items()}
        places = [i for i, c in enumerate(out) if predictions[id(c)] is not None]
        if len(places) < 2:
            return out, None
        measured = sorted((out[i] for i in places), key=lambda c: (predictions[id(c)]["predictedMs"],
                                                                   out.index(c)))
        spread = None
        if _on(context, "poolSessionSpread") and context.judged and found is not None \
                and context.estimated_tokens >= SPREAD_MIN_TOKENS:
            measured, spread = self._spread(measured, predictions, out)
        result = list(out)
        for at, cand in zip(places, measured, strict=True):
            result[at] = cand
        section = {"estimatedTokens": context.estimated_tokens,
                   "predictions": [predictions[id(c)] for c in result if predictions[id(c)] is not None],
                   "unmeasured": [c.node for c in result if predictions[id(c)] is None],
                   "moved": any(a is not b for a, b in zip(result, out, strict=True))}
        if spread is not None:
            section["spread"] = spread
        return result, section

    def _spread(self, measured: list[Any], predictions: dict[int, dict[str, Any] | None],
                base: list[Any]) -> tuple[list[Any], dict[str, Any] | None]:
        """Among the candidates whose prediction ties with the best (within 10 %, and at least
        250 ms), the engine holding the fewest sessions for each slot it has goes first:
        sessions spread by what each engine already holds, not by the moment's queue or the
        local head start. The holder of this session's own context predicts seconds less and
        is not in the tie. Per slot, because a 4-slot engine holding four prompts is no fuller
        than a 1-slot engine holding one (counted whole, every new session went to the
        smallest box: docs/placement.md)."""
        best = predictions[id(measured[0])]["predictedMs"]  # type: ignore[index]
        limit = best + max(SPREAD_TIE_MS, SPREAD_TIE * best)
        tied = [c for c in measured if predictions[id(c)]["predictedMs"] <= limit]  # type: ignore[index]
        if len(tied) < 2:
            return measured, None
        held = {id(c): self.prefixes.sessions(c.node, c.backend) for c in tied}
        share = {id(c): held[id(c)] / (predictions[id(c)]["slots"] or 1) for c in tied}  # type: ignore[index]
        # within a tie the predictions are alike by definition: then the queue-depth order decides
        ordered = sorted(tied, key=lambda c: (share[id(c)], base.index(c)))
        note = {"tied": [c.node for c in ordered], "sessions": [held[id(c)] for c in ordered]}
        return ordered + [c for c in measured if c not in tied], note

    # -- the walk ------------------------------------------------------------------------
    def placed(self, context: Any, candidate: Any) -> None:
        """The engine the walk tries holds this session's prompt from now on."""
        self._remember(context, candidate)

    def failed_over(self, context: Any, candidate: Any) -> None:
        """The engine tried before never took the prompt (it failed, or a busy peer turned it back
        before starting it): it is not remembered there."""
        tried, chain = context.scratch.get(SCRATCH_TRIED), context.scratch.get(SCRATCH_CHAIN)
        if tried is not None and chain:
            self.prefixes.forget(*tried, chain)
        self._remember(context, candidate)

    def exhausted(self, context: Any) -> None:
        key = context.scratch.get(SCRATCH_KEY)
        if key is not None:
            self.holders.forget(key)

    def _remember(self, context: Any, candidate: Any) -> None:
        key = context.scratch.get(SCRATCH_KEY)
        if key is not None:
            self.holders.remember(key, candidate.node, candidate.backend, tokens=context.estimated_tokens)
        chain = context.scratch.get(SCRATCH_CHAIN)
        if chain:
            self.prefixes.remember(candidate.node, candidate.backend, chain, self.slots_of(candidate, context))
            context.scratch[SCRATCH_TRIED] = (candidate.node, candidate.backend)


def _on(context: Any, setting: str) -> bool:
    return int(getattr(context.settings, setting, 0) or 0) > 0

