"""Measured throughput: the evidence throughput-aware placement reads (spec: "Throughput-aware
placement", "Much slower than a node as free"; protocol.md §4a, §2c).

Every chat or completion request an engine serves is timed per node, engine and model. Rates
are in the pool's own token estimate (bytes / 4 of the forwarded body), the unit the budget
is sized in. Evidence sits in eight prompt-size bands doubling from 4096 tokens; a band applies
to prompts of its size and larger. Slower evidence replaces a band at once; a faster sample is
kept beside it and takes over only as the slow evidence decays (held 30 min, then halving every
30 min); everything is forgotten after 2 h. In memory only: a restart forgets it.

Pure bookkeeping: no I/O, a clock injected for tests.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypeGuard

from hubpool_core.models_ids import fold_model_id, same_model

MIN_PROMPT_TOKENS = 4096
MIN_READ_TOKENS = 1024
DEFER_MIN_PROMPT_TOKENS = 6144
PREFILL_BANDS = 8
HOLD_MS = 30 * 60 * 1000
HALF_LIFE_MS = 30 * 60 * 1000
FORGET_AFTER_MS = HOLD_MS + 3 * HALF_LIFE_MS  # 2 h
MAX_PREFILL_GROWTH = 3
MAX_ADVERTISED_THROUGHPUT = 32


def band_of(tokens: float) -> int | None:
    """The band a prompt of ``tokens`` falls in: ``floor(log2(tokens / 4096))`` capped at 7;
    ``None`` under 4096."""
    if not _finite(tokens) or tokens < MIN_PROMPT_TOKENS:
        return None
    return min(PREFILL_BANDS - 1, int(math.floor(math.log2(tokens / MIN_PROMPT_TOKENS))))


def band_from(band: int) -> int:
    """The smallest prompt a band applies to."""
    return MIN_PROMPT_TOKENS << band


def _finite(value: Any) -> TypeGuard[float]:
    """A real number (int or float, never a bool), neither infinite nor NaN."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _positive(value: Any) -> TypeGuard[float]:
    return _finite(value) and value > 0


@dataclass
class Prediction:
    """A candidate's predicted time to a first byte for one prompt.

    ``tokens_per_sec`` is the rate as measured at ``from_prompt_tokens``; ``predicted_ms``
    includes the growth factor when ``extrapolated``. ``deadline``: the reading it rests on is
    a missed deadline, a lower bound on the time ("at least this slow")."""

    tokens_per_sec: float
    from_prompt_tokens: int
    extrapolated: bool
    predicted_ms: float
    source: Literal["observed", "advertised"]
    deadline: bool


@dataclass
class _Reading:
    rate: float  # tokens per second, pool unit
    tokens: int  # the prompt size it was read at (pool unit)
    at: float  # clock seconds
    deadline: bool = False


@dataclass
class _Band:
    slow: _Reading | None = None
    fast: _Reading | None = None


@dataclass
class _Evidence:
    bands: list[_Band]
    decode: _Reading | None = None


def _predict(readings: list[tuple[int, _Reading]], tokens: int, source: Literal["observed", "advertised"]
             ) -> Prediction | None:
    """``readings``: (band floor, reading) for every band that has evidence. Reads the band
    nearest the requested size forward at min(N / measured, 3) times its per-token cost, but
    never faster than the slowest reading at or below that size."""
    applicable = [(floor, r) for floor, r in readings if floor <= tokens and r.rate > 0]
    if tokens < MIN_PROMPT_TOKENS or not applicable:
        return None
    top = max(floor for floor, _ in applicable)
    nearest = min((r for floor, r in applicable if floor == top), key=lambda r: r.rate)
    growth = min(tokens / nearest.tokens, MAX_PREFILL_GROWTH) if tokens > nearest.tokens else 1.0
    rate, basis, extrapolated = nearest.rate / growth, nearest, growth > 1.0
    slowest = min((r for _, r in applicable), key=lambda r: r.rate)
    if slowest.rate < rate:
        rate, basis, extrapolated = slowest.rate, slowest, False
    return Prediction(tokens_per_sec=basis.rate, from_prompt_tokens=basis.tokens, extrapolated=extrapolated,
                      predicted_ms=tokens / rate * 1000.0, source=source, deadline=basis.deadline)


class ThroughputStore:
    """What this node timed: its own engines under ``"local"``, a peer under its FQDN."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._evidence: dict[tuple[str, str, str], _Evidence] = {}

    # -- recording -------------------------------------------------------------------------

    def _slot(self, node: str, backend: str, model: str) -> _Evidence:
        key = (node, backend, fold_model_id(model))
        found = self._evidence.get(key)
        if found is None:
            found = self._evidence[key] = _Evidence([_Band() for _ in range(PREFILL_BANDS)])
        return found

    def _add(self, node: str, backend: str, model: str, band: int, reading: _Reading) -> None:
        slot = self._slot(node, backend, model).bands[band]
        current = self._effective(slot, reading.at)
        if current is None:
            slot.slow, slot.fast = reading, None
        elif reading.rate <= current.rate:  # slower evidence replaces the band at once
            keep = slot.fast if slot.fast is not None and slot.fast.rate > reading.rate else None
            slot.slow, slot.fast = reading, keep
        else:  # a faster sample is kept beside it, to take over as the slow evidence decays
            slot.fast = reading

    def record_prefill(self, node: str, backend: str, model: str, estimated_tokens: int, prefill_ms: float, *,
                       prompt_tokens: int | None = None, cached_tokens: int | None = None,
                       first_byte: bool = False) -> bool:
        """Keep one prefill sample; True when it was kept.

        Under 4096 estimated tokens nothing is kept. With the engine's cache counts (both
        ``prompt_tokens`` and ``cached_tokens``), the turn is timed on the part it read:
        under 1024 tokens read gives no sample, otherwise the sample's size is
        ``estimated_tokens * read / prompt_tokens`` in the pool's unit. ``first_byte``: the
        time is the wait to a stream's first byte (kept the same way; it errs slow)."""
        band = band_of(estimated_tokens)
        if band is None or not _finite(prefill_ms) or prefill_ms <= 0:
            return False
        size = float(estimated_tokens)
        if prompt_tokens is not None and cached_tokens is not None:
            if not (_finite(prompt_tokens) and _finite(cached_tokens)) or prompt_tokens <= 0:
                return False
            read = prompt_tokens - max(0, cached_tokens)
            if read < MIN_READ_TOKENS:
                return False
            size = estimated_tokens * min(read, prompt_tokens) / prompt_tokens
        rate = size / (prefill_ms / 1000.0)
        self._add(node, backend, model, band, _Reading(rate, int(estimated_tokens), self.clock()))
        return True

    def record_deadline_miss(self, node: str, backend: str, model: str, estimated_tokens: int,
                             budget_ms: int) -> None:
        """A streamed request that ran out of its first-byte budget: at least this slow. The
        relay calls it only when the node had nothing else in flight, as it takes samples: a
        miss behind other work times the queue, not the hardware."""
        band = band_of(estimated_tokens)
        if band is None or not _finite(budget_ms) or budget_ms <= 0:
            return
        rate = estimated_tokens / (budget_ms / 1000.0)
        self._add(node, backend, model, band, _Reading(rate, int(estimated_tokens), self.clock(), deadline=True))

    def record_decode(self, node: str, backend: str, model: str, tokens: int, decode_ms: float) -> None:
        """Generation rate: reported, not ranked on. The latest reading stands."""
        if not (_finite(tokens) and _finite(decode_ms)) or tokens <= 0 or decode_ms <= 0:
            return
        self._slot(node, backend, model).decode = _Reading(tokens / (decode_ms / 1000.0), int(tokens), self.clock())

    # -- reading ---------------------------------------------------------------------------

    @staticmethod
    def _effective(band: _Band, now: float) -> _Reading | None:
        """The band's evidence now: forgotten after 2 h; slow evidence holds 30 min, then its
        slowness halves every 30 min until the faster sample kept beside it takes over."""
        forget = FORGET_AFTER_MS / 1000.0
        if band.fast is not None and now - band.fast.at > forget:
            band.fast = None
        if band.slow is not None and now - band.slow.at > forget:
            band.slow = None
        if band.slow is None:
            band.slow, band.fast = band.fast, None
        slow, fast = band.slow, band.fast
        if slow is None or fast is None:
            return slow
        age_ms = (now - slow.at) * 1000.0
        if age_ms <= HOLD_MS:
            return slow
        decayed = slow.rate * 2 ** ((age_ms - HOLD_MS) / HALF_LIFE_MS)
        if decayed >= fast.rate:
            band.slow, band.fast = fast, None
            return fast
        return _Reading(decayed, slow.tokens, slow.at, slow.deadline)

    def _readings(self, node: str, backend: str, model: str) -> list[tuple[int, _Reading]]:
        found = self._evidence.get((node, backend, fold_model_id(model)))
        if found is None:
            return []
        now = self.clock()
        out = []
        for index, band in enumerate(found.bands):
            reading = self._effective(band, now)
            if reading is not None:
                out.append((band_from(index), reading))
        return out

    def predict(self, node: str, backend: str, model: str, estimated_tokens: int) -> Prediction | None:
        """The predicted time to a first byte from this node's own evidence; ``None`` when
        nothing applicable (no band at or below the prompt's size)."""
        return _predict(self._readings(node, backend, model), estimated_tokens, "observed")

    def _entries(self, node: str) -> list[dict[str, Any]]:
        now = self.clock()
        forget = FORGET_AFTER_MS / 1000.0
        rows: list[tuple[float, dict[str, Any]]] = []
        for (who, backend, model), evidence in list(self._evidence.items()):
            if who != node:
                continue
            prefill = []
            newest = math.inf
            for index, band in enumerate(evidence.bands):
                reading = self._effective(band, now)
                if reading is None:
                    continue
                age = max(0.0, now - reading.at)
                newest = min(newest, age)
                prefill.append({"fromTokens": band_from(index), "promptTokens": reading.tokens,
                                "tokensPerSec": round(reading.rate, 1), "deadline": reading.deadline,
                                "ageMs": int(age * 1000)})
            decode = None
            if evidence.decode is not None and now - evidence.decode.at <= forget:
                age = max(0.0, now - evidence.decode.at)
                newest = min(newest, age)
                decode = {"tokensPerSec": round(evidence.decode.rate, 1), "ageMs": int(age * 1000)}
            else:
                evidence.decode = None
            if not prefill and decode is None:
                del self._evidence[(who, backend, model)]
                continue
            rows.append((newest, {"model": model, "backend": backend, "prefill": prefill, "decode": decode}))
        rows.sort(key=lambda row: row[0])
        return [entry for _, entry in rows[:MAX_ADVERTISED_THROUGHPUT]]

    def estimates(self, node: str = "local") -> list[dict[str, Any]]:
        """``PoolThroughputEstimate[]`` of this node's own engines (what capabilities
        advertise as ``throughput`` and status reports): at most 32, newest first, bands
        older than 2 h left out. Empty when nothing was timed (the caller omits the key)."""
        return self._entries(node)

    def observed(self, node: str) -> list[dict[str, Any]]:
        """The same shape for what this node timed of a peer (``node`` is its FQDN)."""
        return self._entries(node)


def _age_of_snapshot_ms(capabilities: dict[str, Any], poll_seconds: int, now: float) -> float:
    stamp = capabilities.get("updatedAt")
    if isinstance(stamp, str):
        try:
            parsed = datetime.fromisoformat(stamp.strip().replace("Z", "+00:00"))
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is not None:
            return max(0.0, (now - parsed.timestamp()) * 1000.0)
    return max(0, poll_seconds if _finite(poll_seconds) else 0) * 1000.0


def peer_snapshot_age_ms(peer: Any) -> float | None:
    """How old a peer's cached capabilities are, from when this node last read them (the
    row's ``last_seen_at``); None when unknown (the snapshot's own ``updatedAt`` is used)."""
    from hubpool_core.peering.peers import aware

    seen = getattr(peer, "last_seen_at", None)
    if not isinstance(seen, datetime):
        return None
    return max(0.0, (time.time() - aware(seen).timestamp()) * 1000.0)


def _snapshot_age(capabilities: dict[str, Any], poll_seconds: int, snapshot_age_ms: float | None,
                  now: float) -> float:
    if _finite(snapshot_age_ms) and snapshot_age_ms >= 0:
        return snapshot_age_ms
    return _age_of_snapshot_ms(capabilities, poll_seconds, now)


def _advertised_entries(capabilities: Any) -> list[dict[str, Any]]:
    """The peer's ``throughput`` entries that name an engine and a model (at most 32)."""
    entries = capabilities.get("throughput") if isinstance(capabilities, dict) else None
    if not isinstance(entries, list):
        return []
    return [e for e in entries[:MAX_ADVERTISED_THROUGHPUT]
            if isinstance(e, dict) and isinstance(e.get("backend"), str) and isinstance(e.get("model"), str)]


def _valid_bands(entry: dict[str, Any], age0: float) -> list[tuple[int, int, float, bool, float]]:
    """(fromTokens, promptTokens, tokensPerSec, deadline, aged ms) of each band routing reads:
    every number finite and positive, ``ageMs`` finite and not negative, ``deadline`` a
    boolean, a band from 4,096 tokens up; aged by the snapshot's age, and gone past 2 h."""
    out = []
    prefill = entry.get("prefill")
    for band in prefill if isinstance(prefill, list) else []:
        if not isinstance(band, dict):
            continue
        start, size, rate, age = (band.get(k) for k in ("fromTokens", "promptTokens", "tokensPerSec", "ageMs"))
        deadline = band.get("deadline", False)
        if not (_positive(start) and _positive(size) and _positive(rate)) or not _finite(age) or age < 0:
            continue
        if not isinstance(deadline, bool) or start < MIN_PROMPT_TOKENS:
            continue
        aged = age + age0
        if aged <= FORGET_AFTER_MS:
            out.append((int(start), int(size), float(rate), deadline, aged))
    return out


def advertised_readings(capabilities: Any, backend: str, model: str, poll_seconds: int, *,
                        snapshot_age_ms: float | None = None, now: float | None = None
                        ) -> list[tuple[int, _Reading]]:
    """A peer's advertised prefill bands for one engine and model, validated and aged
    (:func:`_valid_bands`); anything else is ignored."""
    entries = _advertised_entries(capabilities)
    if not entries:
        return []
    now = time.time() if now is None else now
    age0 = _snapshot_age(capabilities, poll_seconds, snapshot_age_ms, now)
    return [(start, _Reading(rate, size, now - aged / 1000.0, deadline))
            for entry in entries if entry["backend"] == backend and same_model(entry["model"], model)
            for start, size, rate, deadline, aged in _valid_bands(entry, age0)]


def advertised_estimates(capabilities: Any, poll_seconds: int, *, snapshot_age_ms: float | None = None,
                         now: float | None = None) -> list[dict[str, Any]]:
    """A peer's advertised ``throughput`` as routing reads it, in the status shape: only the
    bands :func:`advertised_readings` would use, each ``ageMs`` grown by the snapshot's age,
    and a decode rate under the same rules. Shown whatever the snapshot's freshness, since
    routing reads it until the bands age out."""
    entries = _advertised_entries(capabilities)
    if not entries:
        return []
    now = time.time() if now is None else now
    age0 = _snapshot_age(capabilities, poll_seconds, snapshot_age_ms, now)
    out = []
    for entry in entries:
        prefill = [{"fromTokens": start, "promptTokens": size, "tokensPerSec": round(rate, 1), "deadline": deadline,
                    "ageMs": int(aged)} for start, size, rate, deadline, aged in _valid_bands(entry, age0)]
        decode = None
        raw = entry.get("decode")
        if isinstance(raw, dict) and _positive(raw.get("tokensPerSec")) and _finite(age := raw.get("ageMs")) \
                and age >= 0 and age + age0 <= FORGET_AFTER_MS:
            decode = {"tokensPerSec": round(float(raw["tokensPerSec"]), 1), "ageMs": int(age + age0)}
        if prefill or decode is not None:
            out.append({"model": entry["model"], "backend": entry["backend"], "prefill": prefill, "decode": decode})
    return out


def advertised_prediction(capabilities: Any, backend: str, model: str, estimated_tokens: int, poll_seconds: int,
                          *, snapshot_age_ms: float | None = None, now: float | None = None) -> Prediction | None:
    """The prediction a peer's advertised ``throughput`` gives (``None`` when it advertises
    nothing applicable). The snapshot's age is ``snapshot_age_ms`` when given, else read from
    its ``updatedAt``, else taken as one poll interval."""
    readings = advertised_readings(capabilities, backend, model, poll_seconds,
                                   snapshot_age_ms=snapshot_age_ms, now=now)
    return _predict(readings, estimated_tokens, "advertised")


def combined(observed: Prediction | None, advertised: Prediction | None) -> Prediction | None:
    """The slower of the two, so a peer cannot advertise its way out of a deadline this node
    watched it miss (ties keep the observed one)."""
    if observed is None or advertised is None:
        return observed if observed is not None else advertised
    return advertised if advertised.predicted_ms > observed.predicted_ms else observed
