"""The throughput evidence store: bands, slower-replaces / faster-decays, forgetting, cache
hits, appends, extrapolation, deadline misses, and advertised validation."""

from __future__ import annotations

import math

import pytest

from hubpool_core.placement.throughput import (
    FORGET_AFTER_MS,
    ThroughputStore,
    advertised_prediction,
    band_of,
    combined,
)

MIN = 60.0


class Clock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, minutes: float) -> None:
        self.t += minutes * MIN


def store():
    clock = Clock()
    return ThroughputStore(clock), clock


def rate(s, node="n", tokens=8192, model="m"):
    p = s.predict(node, "ollama", model, tokens)
    return None if p is None else tokens / (p.predicted_ms / 1000)


def test_bands_double_from_4096_and_cap_at_7():
    assert band_of(4095) is None
    assert band_of(4096) == 0 and band_of(8191) == 0 and band_of(8192) == 1
    assert band_of(4096 * 2 ** 7) == 7 and band_of(10 ** 9) == 7


def test_under_4096_tokens_nothing_is_kept_or_predicted():
    s, _ = store()
    assert s.record_prefill("n", "ollama", "m", 4095, 1000) is False
    assert s.predict("n", "ollama", "m", 8192) is None
    assert s.estimates("n") == []
    s.record_prefill("n", "ollama", "m", 8192, 1000)
    assert s.predict("n", "ollama", "m", 4095) is None


def test_a_band_applies_to_larger_prompts_never_smaller():
    s, _ = store()
    s.record_prefill("n", "ollama", "m", 20000, 20000)  # band 2 (16384..)
    assert s.predict("n", "ollama", "m", 16000) is None
    assert s.predict("n", "ollama", "m", 20000).predicted_ms == pytest.approx(20000)


def test_model_is_folded_and_nodes_are_separate():
    s, _ = store()
    s.record_prefill("n", "ollama", "m:latest", 8192, 8192)
    assert s.predict("n", "ollama", "m", 8192) is not None
    assert s.predict("other", "ollama", "m", 8192) is None
    assert s.predict("n", "vllm", "m", 8192) is None


def test_slower_replaces_at_once_faster_is_kept_and_takes_over_as_the_slow_decays():
    s, clock = store()
    s.record_prefill("n", "ollama", "m", 8192, 8192)  # 1000 tok/s
    s.record_prefill("n", "ollama", "m", 8192, 81920)  # 100 tok/s: replaces at once
    assert rate(s) == pytest.approx(100)
    clock.advance(10)
    s.record_prefill("n", "ollama", "m", 8192, 1024)  # 8000 tok/s: kept beside, not used yet
    assert rate(s) == pytest.approx(100)
    clock.advance(19)
    assert rate(s) == pytest.approx(100)  # still held
    clock.advance(31)  # 60 min since the slow one: one half-life after the hold
    assert rate(s) == pytest.approx(200, rel=1e-3)
    clock.advance(30)
    assert rate(s) == pytest.approx(400, rel=1e-3)
    clock.advance(29)  # 119 min: slow decayed to ~800, still below the fast 8000
    assert rate(s) < 8000
    clock.advance(2)  # slow forgotten after 2 h: the fast reading is the band
    assert rate(s) == pytest.approx(8000)


def test_a_fast_sample_takes_over_once_the_decay_passes_it():
    s, clock = store()
    s.record_prefill("n", "ollama", "m", 8192, 8192 * 10)  # 100 tok/s
    s.record_prefill("n", "ollama", "m", 8192, 8192 * 10 / 3)  # 300 tok/s beside it
    clock.advance(30 + 30 * math.log2(3) + 1)
    assert rate(s) == pytest.approx(300)


def test_without_faster_evidence_a_slow_reading_holds_until_forgotten():
    s, clock = store()
    s.record_prefill("n", "ollama", "m", 8192, 81920)
    clock.advance(119)
    assert rate(s) == pytest.approx(100)
    clock.advance(FORGET_AFTER_MS / 60000 - 119 + 0.1)
    assert s.predict("n", "ollama", "m", 8192) is None
    assert s.estimates("n") == []


def test_cache_hits_under_1024_tokens_read_give_no_sample():
    s, _ = store()
    # Ollama 0.34.4: a repeated 7,615-token prompt (estimate 5,033) read in 19 ms, 1 token read
    assert s.record_prefill("n", "ollama", "m", 5033, 19, prompt_tokens=7615, cached_tokens=7614) is False
    assert s.predict("n", "ollama", "m", 5033) is None
    # the cold read of the same prompt counts
    assert s.record_prefill("n", "ollama", "m", 5033, 2735, prompt_tokens=7615, cached_tokens=0) is True
    assert rate(s, tokens=5033) == pytest.approx(5033 / 2.735)


def test_appends_are_reads_timed_on_the_part_read():
    s, _ = store()
    # a turn appended to an 11,820-token history read 1,484 tokens in 427 ms
    est = 11820
    assert s.record_prefill("n", "ollama", "m", est, 427, prompt_tokens=11820, cached_tokens=11820 - 1484)
    p = s.predict("n", "ollama", "m", est)
    assert p.tokens_per_sec == pytest.approx(1484 / 0.427)
    assert p.from_prompt_tokens == est


def test_engines_that_do_not_report_their_cache_are_timed_on_the_whole_prompt():
    s, _ = store()
    assert s.record_prefill("n", "ollama", "m", 8192, 2048, prompt_tokens=9000)  # no cache count
    assert rate(s) == pytest.approx(4000)
    assert s.record_prefill("n", "ollama", "m", 8192, 1000, first_byte=True) is True


def test_extrapolation_reads_the_nearest_band_forward_at_most_threefold():
    s, _ = store()
    # fzzy: 123 tok/s at 10.6k; a 46k prompt is read at 3x the per-token cost
    s.record_prefill("fzzy", "ollama", "m", 10600, 10600 / 123 * 1000)
    p = s.predict("fzzy", "ollama", "m", 46000)
    assert p.extrapolated and p.from_prompt_tokens == 10600 and p.tokens_per_sec == pytest.approx(123)
    assert p.predicted_ms == pytest.approx(46000 / 41 * 1000)
    # a 1.5x longer prompt: growth 1.5
    q = s.predict("fzzy", "ollama", "m", 15900)
    assert q.predicted_ms == pytest.approx(15900 / 82 * 1000)


def test_never_faster_than_the_slowest_reading_at_or_below():
    s, _ = store()
    s.record_prefill("n", "ollama", "m", 5000, 5000 / 50 * 1000)  # 50 tok/s, band 0
    s.record_prefill("n", "ollama", "m", 40000, 40000 / 500 * 1000)  # 500 tok/s, band 3
    p = s.predict("n", "ollama", "m", 60000)
    assert p.tokens_per_sec == pytest.approx(50) and not p.extrapolated
    assert p.predicted_ms == pytest.approx(60000 / 50 * 1000)
    assert p.from_prompt_tokens == 5000


def test_only_the_nearest_measurement_is_read_forward():
    s, _ = store()
    s.record_prefill("n", "ollama", "m", 5000, 5000 / 1000 * 1000)  # 1000 tok/s
    s.record_prefill("n", "ollama", "m", 20000, 20000 / 800 * 1000)  # 800 tok/s
    p = s.predict("n", "ollama", "m", 30000)
    assert p.from_prompt_tokens == 20000 and p.predicted_ms == pytest.approx(30000 / (800 / 1.5) * 1000)


def test_deadline_misses_are_lower_bounds():
    s, _ = store()
    s.record_deadline_miss("fzzy", "ollama", "m", 46000, 922_000)
    p = s.predict("fzzy", "ollama", "m", 46000)
    assert p.deadline and p.predicted_ms == pytest.approx(922_000)
    est = s.estimates("fzzy")
    assert est[0]["prefill"][0]["deadline"] is True and est[0]["prefill"][0]["fromTokens"] == 32768


def test_estimates_shape_decode_and_limit():
    s, clock = store()
    s.record_prefill("local", "ollama", "m", 10000, 5000)
    s.record_decode("local", "ollama", "m", 100, 2000)
    [entry] = s.estimates()
    assert entry == {"model": "m", "backend": "ollama",
                     "prefill": [{"fromTokens": 8192, "promptTokens": 10000, "tokensPerSec": 2000.0,
                                  "deadline": False, "ageMs": 0}],
                     "decode": {"tokensPerSec": 50.0, "ageMs": 0}}
    for i in range(40):
        s.record_prefill("local", "ollama", f"m{i}", 8192, 1000)
    assert len(s.estimates()) == 32
    assert s.observed("local") == s.estimates("local")
    assert s.observed("peer.example") == []
    clock.advance(121)
    assert s.estimates() == []


def caps(*bands, backend="ollama", model="m", updated=None, **extra):
    return {"hardwareTier": "high", "throughput": [{"model": model, "backend": backend, "prefill": list(bands),
                                                    "decode": None}], **({"updatedAt": updated} if updated else {}),
            **extra}


def band(from_tokens=8192, tokens=10000, tps=500.0, age=0, deadline=False):
    return {"fromTokens": from_tokens, "promptTokens": tokens, "tokensPerSec": tps, "deadline": deadline,
            "ageMs": age}


def test_advertised_prediction_reads_a_peers_bands():
    p = advertised_prediction(caps(band()), "ollama", "m:latest", 10000, 10, snapshot_age_ms=0)
    assert p.source == "advertised" and p.predicted_ms == pytest.approx(20000)
    assert advertised_prediction(caps(band()), "vllm", "m", 10000, 10, snapshot_age_ms=0) is None
    assert advertised_prediction(caps(band()), "ollama", "other", 10000, 10, snapshot_age_ms=0) is None
    assert advertised_prediction({}, "ollama", "m", 10000, 10) is None
    assert advertised_prediction(None, "ollama", "m", 10000, 10) is None


@pytest.mark.parametrize("bad", [
    {"tokensPerSec": float("nan")}, {"tokensPerSec": float("inf")}, {"tokensPerSec": 0}, {"tokensPerSec": -5},
    {"tokensPerSec": "500"}, {"fromTokens": 0}, {"promptTokens": None}, {"ageMs": -1}, {"ageMs": float("nan")},
    {"deadline": "yes"}, {"tokensPerSec": True},
])
def test_advertised_invalid_bands_are_ignored(bad):
    entry = {**band(), **bad}
    assert advertised_prediction(caps(entry), "ollama", "m", 10000, 10, snapshot_age_ms=0) is None
    # a valid band beside it still counts
    p = advertised_prediction(caps(entry, band(tps=250.0)), "ollama", "m", 10000, 10, snapshot_age_ms=0)
    assert p is not None and p.tokens_per_sec == 250.0


def test_advertised_bands_age_by_the_snapshot_and_are_forgotten():
    fresh = caps(band(age=FORGET_AFTER_MS - 1000))
    assert advertised_prediction(fresh, "ollama", "m", 10000, 10, snapshot_age_ms=500) is not None
    assert advertised_prediction(fresh, "ollama", "m", 10000, 10, snapshot_age_ms=2000) is None
    # the snapshot's own updatedAt when no age is given
    stamped = caps(band(age=FORGET_AFTER_MS - 1000), updated="2026-09-30T12:00:00.000Z")
    from datetime import datetime

    t = datetime.fromisoformat("2026-09-30T12:00:00+00:00").timestamp()
    assert advertised_prediction(stamped, "ollama", "m", 10000, 10, now=t + 0.5) is not None
    assert advertised_prediction(stamped, "ollama", "m", 10000, 10, now=t + 2) is None


def test_combined_takes_the_slower():
    s, _ = store()
    s.record_deadline_miss("p", "ollama", "m", 46000, 922_000)
    observed = s.predict("p", "ollama", "m", 46000)
    advertised = advertised_prediction(caps(band(from_tokens=32768, tokens=46000, tps=500.0)), "ollama", "m", 46000,
                                       10, snapshot_age_ms=0)
    assert combined(observed, advertised) is observed
    assert combined(None, advertised) is advertised and combined(observed, None) is observed
    assert combined(None, None) is None
