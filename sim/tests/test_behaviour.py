"""Slots, the prompt cache, speed, runtime configuration, and the asyncio API."""

from __future__ import annotations

import asyncio
import threading
import time

import aiohttp
import httpx

from hubpool_sim import SimConfig, SimModel, SimServer, run_in_thread
from hubpool_sim.testing import sse_events, wait_until

CHAT = "llama3.2:3b"


def chat(content: str, **extra):
    return {"model": CHAT, "messages": [{"role": "user", "content": content}], **extra}


def test_slots_queue_the_excess():
    with run_in_thread(SimConfig(flavor="vllm", slots=1, decode_ms_per_token=40)) as sim:
        results = []
        threads = [
            threading.Thread(target=lambda i=i: results.append(
                httpx.post(sim.url + "/v1/chat/completions", json=chat(f"question {i}"), timeout=10).status_code))
            for i in range(3)
        ]
        started = time.monotonic()
        for t in threads:
            t.start()
        assert wait_until(lambda: sim.stats()["queued"] == 2)
        stats = sim.stats()
        assert stats["in_flight"] == 1
        metrics = httpx.get(sim.url + "/metrics").text
        assert f'vllm:num_requests_waiting{{engine="0",model_name="{CHAT}"}} 2.0' in metrics
        for t in threads:
            t.join()
        elapsed = time.monotonic() - started
        final = sim.stats()
    assert results == [200, 200, 200]
    assert elapsed >= 3 * 8 * 0.04 * 0.9  # served one after another
    assert final["peak_in_flight"] == 1 and final["queued"] == 0 and final["in_flight"] == 0
    assert final["completed"] == 4 and final["by_path"]["/v1/chat/completions"] == 3  # and /metrics


def test_llamacpp_slots_show_processing():
    # 100 tokens at 30 ms: a 3 s window to see the slot busy in, however slowly a loaded machine polls
    with run_in_thread(SimConfig(flavor="llamacpp", slots=2, decode_ms_per_token=30, tokens=100)) as sim:
        worker = threading.Thread(target=lambda: httpx.post(sim.url + "/v1/chat/completions", json=chat("hi"), timeout=30))
        worker.start()
        assert wait_until(lambda: any(s["is_processing"] for s in httpx.get(sim.url + "/slots").json()))
        worker.join()
        assert not any(s["is_processing"] for s in httpx.get(sim.url + "/slots").json())


def test_prompt_cache_reports_shared_prefix():
    system = {"role": "system", "content": "You are terse. " * 20}  # 300 bytes
    first = {"model": CHAT, "messages": [system, {"role": "user", "content": "first question"}]}
    follow = {"model": CHAT, "messages": [system, {"role": "user", "content": "second question"}]}
    shared = len(f"system: {system['content']}\nuser: ".encode())
    with run_in_thread(SimConfig(flavor="vllm", slots=1)) as sim:
        cold = httpx.post(sim.url + "/v1/chat/completions", json=first).json()
        warm = httpx.post(sim.url + "/v1/chat/completions", json=follow).json()
    assert "prompt_tokens_details" not in cold["usage"]  # vLLM adds it only on a hit
    assert warm["usage"]["prompt_tokens_details"] == {"cached_tokens": shared // 4}

    with run_in_thread(SimConfig(flavor="llamacpp", slots=1, timings=True)) as sim:
        cold = httpx.post(sim.url + "/v1/chat/completions", json=first).json()
        events = sse_events(httpx.post(sim.url + "/v1/chat/completions", json={**follow, "stream": True}).text)
    assert cold["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert cold["timings"]["cache_n"] == 0 and cold["timings"]["prompt_n"] == cold["usage"]["prompt_tokens"]
    final = events[-2]
    assert final["choices"][0]["finish_reason"] == "stop"
    timings = final["timings"]
    assert timings["cache_n"] == shared // 4
    assert set(timings) == {"cache_n", "prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms",
                            "predicted_per_second"}
    assert timings["predicted_n"] == 8

    with run_in_thread(SimConfig(flavor="ollama", slots=1)) as sim:
        cold = httpx.post(sim.url + "/api/chat", json={**first, "stream": False}).json()
        warm = httpx.post(sim.url + "/api/chat", json={**follow, "stream": False}).json()
    total = -(-len(f"system: {system['content']}\nuser: second question\n".encode()) // 4)
    assert warm["prompt_eval_count"] == total - shared // 4  # Ollama counts only what it evaluated
    assert cold["prompt_eval_count"] > warm["prompt_eval_count"]


def test_prompt_cache_can_be_off_and_never_covers_the_whole_prompt():
    with run_in_thread(SimConfig(flavor="llamacpp", slots=1)) as sim:
        httpx.post(sim.url + "/v1/chat/completions", json=chat("same words"))
        again = httpx.post(sim.url + "/v1/chat/completions", json=chat("same words")).json()
        sim.configure(prompt_cache=False)
        off = httpx.post(sim.url + "/v1/chat/completions", json=chat("same words")).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == again["usage"]["prompt_tokens"] - 1
    assert off["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_prefill_delays_the_first_byte_and_cache_skips_it():
    # one client, so neither request pays for a new connection; the warm bound is half the
    # prefill, which a cached prompt never comes near (a loaded CI box adds tens of ms)
    prompt = "z" * 1600  # 400 tokens at 1000 tok/s = 0.4 s
    with run_in_thread(SimConfig(flavor="vllm", slots=1, prefill_tps=1000)) as sim, \
            httpx.Client(trust_env=False, timeout=30) as client:
        started = time.monotonic()
        client.post(sim.url + "/v1/completions", json={"model": CHAT, "prompt": prompt})
        cold = time.monotonic() - started
        started = time.monotonic()
        client.post(sim.url + "/v1/completions", json={"model": CHAT, "prompt": prompt})
        warm = time.monotonic() - started
    assert cold >= 0.38
    assert warm < 0.2


def test_load_delay_only_when_cold():
    with run_in_thread(SimConfig(load_ms=150)) as sim:
        first = httpx.post(sim.url + "/api/chat", json=chat("a", stream=False)).json()
        second = httpx.post(sim.url + "/api/chat", json=chat("b", stream=False)).json()
    assert first["load_duration"] >= 150_000_000 and second["load_duration"] == 0


def test_runtime_config_over_http():
    with run_in_thread(SimConfig(flavor="llamacpp", slots=1)) as sim:
        changed = httpx.post(sim.url + "/_sim/config", json={"slots": 3, "tokens": 2, "timings": True}).json()
        slots = httpx.get(sim.url + "/slots").json()
        body = httpx.post(sim.url + "/v1/chat/completions", json=chat("hi")).json()
        refused = httpx.post(sim.url + "/_sim/config", json={"flavor": "vllm"})
        bad = httpx.post(sim.url + "/_sim/config", json={"slots": 0})
        still = httpx.get(sim.url + "/_sim/config").json()
    assert changed["slots"] == 3 and len(slots) == 3
    assert body["choices"][0]["message"]["content"] == "tok0 tok1" and "timings" in body
    assert refused.status_code == 400 and "flavor" in refused.json()["error"]
    assert bad.status_code == 400 and still["slots"] == 3


def test_async_api_with_aiohttp_client():
    async def scenario():
        cfg = SimConfig(flavor="vllm", models=[SimModel("qwen3:8b", window=8192)], slots=2, decode_ms_per_token=0)
        async with SimServer(cfg, host="127.0.0.1", port=0) as sim:
            assert sim.url == f"http://127.0.0.1:{sim.port}" and sim.port > 0
            sim.add_fault("error:503", count=1)
            async with aiohttp.ClientSession() as session:
                async with session.post(sim.url + "/v1/chat/completions", json={"model": "qwen3:8b", "messages": []}) as r:
                    first = (r.status, await r.json())
                async with session.post(sim.url + "/v1/chat/completions",
                                        json={"model": "qwen3:8b", "messages": [{"role": "user", "content": "hi"}]}) as r:
                    second = r.status
            return first, second, sim.stats()

    (status, body), second, stats = asyncio.run(scenario())
    assert status == 503 and body["message"] == "simulated fault: HTTP 503 Service Unavailable"
    assert second == 200 and stats["faults_served"] == 1 and stats["completed"] == 2


def test_explicit_start_and_stop():
    async def scenario():
        sim = await SimServer(SimConfig(flavor="omlx")).start()
        try:
            async with aiohttp.ClientSession() as session:
                async with session.get(sim.url + "/health") as r:
                    return await r.json()
        finally:
            await sim.stop()

    assert asyncio.run(scenario()) == {"status": "healthy"}
