"""A scaled clock (``time_scale``), the prompt-token counters, ``/_sim/flush`` and the
oracle's ``/_sim/estimate``: what ``hubpool bench pool`` builds its nodes from."""

from __future__ import annotations

import threading
import time

import httpx

from hubpool_sim import SimConfig, SimModel, run_in_thread
from hubpool_sim.testing import wait_until

MODEL = "llama3.2:3b"
PROMPT = "x" * 4000  # 1,000 tokens


def chat(content: str, **extra):
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}


def test_a_scaled_clock_waits_less_and_reports_the_unscaled_durations():
    config = SimConfig(flavor="llamacpp", prefill_tps=100, decode_tps=100, timings=True, time_scale=0.02,
                       models=[SimModel(MODEL, window=32768)])
    with run_in_thread(config) as sim:
        started = time.monotonic()
        answer = httpx.post(sim.url + "/v1/chat/completions", json=chat(PROMPT), timeout=30).json()
        wall = time.monotonic() - started
    timings = answer["timings"]
    # ~1,003 tokens at 100 tok/s is ~10 s reported and 0.2 s waited; 4 tokens at 100 tok/s are 40 ms
    # reported. The prefill is the simulated hardware's, exactly, however late the host woke the
    # engine; the decode is timed (bounds loose: a loaded box oversleeps, each ms late reads as 50)
    assert timings["prompt_ms"] == round(timings["prompt_n"] / 100 * 1000, 3)
    assert 9_900 <= timings["prompt_ms"] <= 11_000
    assert 30 <= timings["predicted_ms"] <= 2_000
    assert wall < 0.5 * timings["prompt_ms"] / 1000  # it waited far less than it reports


def test_counters_flush_and_estimate():
    config = SimConfig(flavor="ollama", prefill_tps=1000, decode_ms_per_token=100, load_ms=5000, slots=1,
                       time_scale=0.05, models=[SimModel(MODEL, window=32768)])
    with run_in_thread(config) as sim:
        cold = httpx.post(sim.url + "/_sim/estimate", json=chat(PROMPT)).json()["firstTokenMs"]
        assert 5900 <= cold <= 6300  # load 5 s + prefill ~1 s + the first token's 0.1 s
        httpx.post(sim.url + "/v1/chat/completions", json=chat(PROMPT), timeout=10)
        warm = httpx.post(sim.url + "/_sim/estimate", json=chat(PROMPT)).json()["firstTokenMs"]
        assert warm < 200  # resident, and the whole prompt but its last token is cached
        stats = sim.stats()
        assert stats["prompt_tokens"] >= 1000 and stats["cached_tokens"] == 0
        httpx.post(sim.url + "/v1/chat/completions", json=chat(PROMPT), timeout=10)
        assert sim.stats()["cached_tokens"] >= 990
        # one request holds the only slot: a second one waits for it to end
        worker = threading.Thread(target=lambda: httpx.post(
            sim.url + "/v1/chat/completions", json=chat("y" * 120000, max_tokens=40), timeout=30))
        worker.start()
        assert wait_until(lambda: sim.stats()["in_flight"] == 1)
        behind = httpx.post(sim.url + "/_sim/estimate", json=chat(PROMPT)).json()["firstTokenMs"]
        assert behind > 4000  # ~30 s of prefill and 4 s of decode ahead of it, minus what has run
        worker.join()
        flushed = httpx.post(sim.url + "/_sim/flush").json()
        assert flushed["in_flight"] == 0
        again = httpx.post(sim.url + "/_sim/estimate", json=chat(PROMPT)).json()["firstTokenMs"]
        assert again >= 5900  # cold once more: nothing resident, nothing cached
        assert httpx.post(sim.url + "/_sim/estimate", json={"model": "nope"}).status_code == 404


def test_the_estimate_plays_each_waiter_forward_with_its_own_answer_length():
    """One slot: a request runs (6 s of answer), a second waits with max_tokens 100 (10 s of
    answer). A third's first token comes after both: over 10 s away, not the engine's
    default 8-token answer (0.8 s) behind the one that runs."""
    config = SimConfig(flavor="llamacpp", prefill_tps=10_000, decode_ms_per_token=100, slots=1,
                       time_scale=0.1, models=[SimModel(MODEL, window=32768)])
    with run_in_thread(config) as sim:
        def send(content: str, answer: int) -> None:
            httpx.post(sim.url + "/v1/chat/completions", json=chat(content, max_tokens=answer), timeout=30)

        running = threading.Thread(target=send, args=("first", 60))
        running.start()
        assert wait_until(lambda: sim.stats()["in_flight"] == 1)
        waiting = threading.Thread(target=send, args=("second", 100))
        waiting.start()
        assert wait_until(lambda: sim.stats()["queued"] == 1)
        behind = httpx.post(sim.url + "/_sim/estimate", json=chat("third")).json()["firstTokenMs"]
        running.join()
        waiting.join()
    assert 10_000 <= behind <= 16_500  # the waiter's 10 s, and what is left of the 6 s ahead of it
