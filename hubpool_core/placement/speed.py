"""What predicted time to first token is computed from (hubpool's own; docs/placement.md):
each engine's measured speed per node and model, how long its model takes to load, which
models it holds in memory, and the fresher load a forwarded answer reports.

The spec's throughput evidence (:mod:`throughput`) starts at 4,096-token prompts and keeps
the slowest reading, which is right for deciding who misses a deadline and wrong for ranking
short prompts, so this book keeps plain moving averages of every read the engine timed:
prefill rate, how long a request holds a slot (prefill and decode), and load time. In
memory only; a restart forgets it. Pure bookkeeping: no I/O.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from hubpool_core.models_ids import fold_model_id, same_model

#: weight of a new reading in the moving averages
ALPHA = 0.3
#: a read this short times fixed costs, not the hardware (the spec's cache-hit rule, scaled down)
MIN_READ_TOKENS = 64
#: how long a model with no measured load time is taken to need to load
DEFAULT_LOAD_MS = 30_000.0
#: speed entries a node advertises
MAX_ADVERTISED = 32
#: how long a residency reading stands without a newer one
RESIDENCY_TTL_S = 600.0
#: ``PlacementContext.scratch`` keys the predicted-TTFT stage writes for the stages after it and
#: the admission queue: id(candidate) -> predicted ms (``None``: no evidence), and id(candidate)
#: -> how much one more request queued ahead adds to its wait (service time over slots)
SCRATCH_PREDICTED = "ttft_predicted"
SCRATCH_SLOT_MS = "ttft_slot_ms"
#: id(candidate) -> the prefill and load predicted for the request there (its slot clock's plan)
SCRATCH_BEFORE = "ttft_before"
#: id(candidate) -> the wait for a slot predicted there (ms)
SCRATCH_WAIT = "ttft_wait"


def _finite_positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


@dataclass
class Speed:
    """One engine's averages for one model: ``None`` is not measured."""

    prefill_tps: float | None = None
    service_ms: float | None = None
    load_ms: float | None = None
    at: float = 0.0
    #: how long one answer token takes to decode, and how many tokens an answer runs (the
    #: schedule of the work in flight: :mod:`slot_clock`)
    decode_ms_per_token: float | None = None
    answer_tokens: float | None = None


def _average(old: float | None, new: float) -> float:
    return new if old is None else (1 - ALPHA) * old + ALPHA * new


class SpeedBook:
    """(node, engine kind, model) -> :class:`Speed`; this node's engines under ``"local"``."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._rows: dict[tuple[str, str, str], Speed] = {}

    def _row(self, node: str, backend: str, model: str) -> Speed:
        key = (node, backend, fold_model_id(model))
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = Speed()
        row.at = self.clock()
        return row

    def record_read(self, node: str, backend: str, model: str, tokens: float, ms: float) -> bool:
        """A prefill the engine timed: ``tokens`` read (pool units) in ``ms``. Reads under
        :data:`MIN_READ_TOKENS` are fixed cost and not kept. True when kept."""
        if not (_finite_positive(tokens) and _finite_positive(ms)) or tokens < MIN_READ_TOKENS:
            return False
        row = self._row(node, backend, model)
        row.prefill_tps = _average(row.prefill_tps, tokens / (ms / 1000.0))
        return True

    def record_service(self, node: str, backend: str, model: str, ms: float) -> None:
        """How long one request held the engine (its prefill and its decode)."""
        if _finite_positive(ms):
            row = self._row(node, backend, model)
            row.service_ms = _average(row.service_ms, ms)

    def record_answer(self, node: str, backend: str, model: str, tokens: float, ms: float) -> None:
        """An answer the engine timed: ``tokens`` decoded in ``ms``."""
        if _finite_positive(tokens) and _finite_positive(ms):
            row = self._row(node, backend, model)
            row.decode_ms_per_token = _average(row.decode_ms_per_token, ms / tokens)
            row.answer_tokens = _average(row.answer_tokens, tokens)

    def record_load(self, node: str, backend: str, model: str, ms: float) -> None:
        """How long the engine took to load the model."""
        if _finite_positive(ms):
            row = self._row(node, backend, model)
            row.load_ms = _average(row.load_ms, ms)

    def get(self, node: str, backend: str, model: str) -> Speed | None:
        return self._rows.get((node, backend, fold_model_id(model)))

    def node_prior(self, node: str) -> Speed | None:
        """The node's most recently measured prefill on any engine or model: a prior for a
        model it never served here (so a cold load can be priced before the first request)."""
        rows = [v for k, v in self._rows.items() if k[0] == node and v.prefill_tps is not None]
        if not rows:
            return None
        newest = max(rows, key=lambda v: v.at)
        return Speed(newest.prefill_tps, newest.service_ms, None)

    def advertised(self, node: str = "local") -> list[dict[str, Any]]:
        """This node's own averages, newest first, as capabilities carry them."""
        rows = sorted(((k, v) for k, v in self._rows.items() if k[0] == node), key=lambda kv: -kv[1].at)
        out = []
        for (_, backend, model), speed in rows[:MAX_ADVERTISED]:
            entry: dict[str, Any] = {"backend": backend, "model": model}
            for key, value in (("prefillTps", speed.prefill_tps), ("serviceMs", speed.service_ms),
                               ("loadMs", speed.load_ms)):
                if value is not None:
                    entry[key] = round(value, 1)
            out.append(entry)
        return out


def advertised_speed(capabilities: Any, backend: str, model: str) -> Speed | None:
    """A peer's advertised averages for one engine and model (``speed`` in capabilities),
    validated: anything not a finite positive number is ignored; ``None`` when none."""
    entries = capabilities.get("speed") if isinstance(capabilities, dict) else None
    if not isinstance(entries, list):
        return None
    for entry in entries[:MAX_ADVERTISED]:
        if not isinstance(entry, dict) or entry.get("backend") != backend:
            continue
        named = entry.get("model")
        if not isinstance(named, str) or not same_model(named, model):
            continue
        values = {k: float(entry[k]) if _finite_positive(entry.get(k)) else None
                  for k in ("prefillTps", "serviceMs", "loadMs")}
        return Speed(values["prefillTps"], values["serviceMs"], values["loadMs"])
    return None


def advertised_prior(capabilities: Any) -> Speed | None:
    """The first valid prefill rate a peer advertises for any engine or model (newest first)."""
    entries = capabilities.get("speed") if isinstance(capabilities, dict) else None
    for entry in entries[:MAX_ADVERTISED] if isinstance(entries, list) else []:
        if isinstance(entry, dict) and _finite_positive(entry.get("prefillTps")):
            service: Any = entry.get("serviceMs")
            return Speed(float(entry["prefillTps"]), float(service) if _finite_positive(service) else None, None)
    return None


def merged(observed: Speed | None, advertised: Speed | None) -> Speed | None:
    """What this node timed, filled in with what the peer says of itself where it timed nothing."""
    if observed is None or advertised is None:
        return observed or advertised
    return Speed(observed.prefill_tps if observed.prefill_tps is not None else advertised.prefill_tps,
                 observed.service_ms if observed.service_ms is not None else advertised.service_ms,
                 observed.load_ms if observed.load_ms is not None else advertised.load_ms)


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def candidate_slots(candidate: Any, settings: Any, engine_by_kind: dict[str, Any]) -> int | None:
    """Requests a candidate's engine runs at once, as far as this node knows: what the engine
    reports (a local probe's ``slots``, a peer's advertised ``engineSlots``), else what its
    node states (``ollamaSlots``) for an engine whose concurrency is a slot count; ``None``
    when nothing says."""
    if candidate.is_local:
        reported = _whole(getattr(candidate.local.snapshot.result, "slots", None))
        if reported is not None:
            return reported
        if getattr(candidate.local.engine, "states_slots", False):
            return _whole(getattr(settings, "ollamaSlots", None))
        return None
    caps = getattr(candidate.peer, "last_capabilities", None)
    if not isinstance(caps, dict):
        return None
    entries = caps.get("engineSlots")
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("backend") == candidate.backend:
            reported = _whole(entry.get("slots"))
            if reported is not None:
                return reported
    if getattr(engine_by_kind.get(candidate.backend), "states_slots", False):
        return _whole(caps.get("ollamaSlots"))
    return None


class ResidencyView:
    """Which models each engine holds in memory, as far as this node knows: its own engines
    as their residency reads say (refreshed off the request path) and as it has seen them
    serve, a peer's as it advertises them. Unknown is ``None``, never "cold"."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._held: dict[tuple[str, str], tuple[set[str], float]] = {}
        #: models each engine was seen serving, and when: resident then, whatever was read before
        self._served: dict[tuple[str, str, str], float] = {}

    def set(self, node: str, backend: str, models: Iterable[str] | None) -> None:
        """The engine's own answer (``None``: it could not say, which forgets what was known)."""
        if models is None:
            self._held.pop((node, backend), None)
        else:
            self._held[(node, backend)] = ({fold_model_id(m) for m in models}, self.clock())

    def served(self, node: str, backend: str, model: str) -> None:
        """The engine just served ``model``: it holds it now."""
        if len(self._served) >= 4096:
            self._served.clear()
        self._served[(node, backend, fold_model_id(model))] = self.clock()

    def resident(self, node: str, backend: str, model: str) -> bool | None:
        """True or False as last read (or seen served since), ``None`` when unknown."""
        folded = fold_model_id(model)
        found = self._held.get((node, backend))
        seen = self._served.get((node, backend, folded))
        if seen is not None and (found is None or seen >= found[1]) and self.clock() - seen <= RESIDENCY_TTL_S:
            return True
        if found is None or self.clock() - found[1] > RESIDENCY_TTL_S:
            return None
        return folded in found[0]

    def served_at(self, node: str, backend: str, model: str) -> float | None:
        """When the engine was last seen serving ``model`` (this view's clock), within the TTL."""
        seen = self._served.get((node, backend, fold_model_id(model)))
        return seen if seen is not None and self.clock() - seen <= RESIDENCY_TTL_S else None

    def models(self, node: str, backend: str) -> list[str] | None:
        found = self._held.get((node, backend))
        return None if found is None else sorted(found[0])


def advertised_residency(capabilities: Any, backend: str) -> list[str] | None:
    """The models a peer says one of its engines holds in memory (``resident`` in
    capabilities: ``[{backend, models}]``); ``None`` when it does not say, which is unknown."""
    entries = capabilities.get("resident") if isinstance(capabilities, dict) else None
    if not isinstance(entries, list):
        return None
    for entry in entries[:32]:
        if isinstance(entry, dict) and entry.get("backend") == backend:
            models = entry.get("models")
            if isinstance(models, list) and all(isinstance(m, str) and len(m) <= 300 for m in models):
                return models[:2000]
            return None
    return None
