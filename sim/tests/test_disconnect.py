"""A client that hangs up is noticed and counted as aborted, wherever its request was.

This is what hubpool's tests lean on to prove a node aborted its upstream request when its
own client went away (spec: "Client hang-ups").
"""

from __future__ import annotations

import asyncio
import threading

import aiohttp
import httpx
import pytest

from hubpool_sim import SimConfig, SimServer, run_in_thread
from hubpool_sim.testing import wait_until

CHAT = "llama3.2:3b"
BODY = {"model": CHAT, "messages": [{"role": "user", "content": "tell me a long story"}]}


def test_hang_up_mid_stream_is_aborted():
    with run_in_thread(SimConfig(flavor="ollama", decode_ms_per_token=50, tokens=100)) as sim:
        with httpx.stream("POST", sim.url + "/api/chat", json=BODY) as response:
            first = next(response.iter_lines())
            assert '"done":false' in first
        assert wait_until(lambda: sim.stats()["aborted"] == 1)
        stats = sim.stats()
    assert stats["in_flight"] == 0 and stats["completed"] == 0


def test_hang_up_during_prefill_is_aborted():
    long_prompt = {"model": CHAT, "prompt": "p" * 4000, "stream": True}  # 1000 tokens at 1000 tok/s
    with run_in_thread(SimConfig(flavor="vllm", prefill_tps=1000)) as sim:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(sim.url + "/v1/completions", json=long_prompt, timeout=0.2)
        assert wait_until(lambda: sim.stats()["aborted"] == 1)
        assert sim.stats()["in_flight"] == 0


def test_hang_up_while_queued_is_aborted_and_leaves_the_queue():
    with run_in_thread(SimConfig(flavor="llamacpp", slots=1, decode_ms_per_token=40)) as sim:
        holder = threading.Thread(target=lambda: httpx.post(sim.url + "/v1/chat/completions", json=BODY, timeout=10))
        holder.start()
        assert wait_until(lambda: sim.stats()["in_flight"] == 1)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(sim.url + "/v1/chat/completions", json=BODY, timeout=0.1)
        assert wait_until(lambda: sim.stats()["aborted"] == 1)
        assert sim.stats()["queued"] == 0
        holder.join()
        stats = sim.stats()
    assert stats["completed"] == 1 and stats["in_flight"] == 0


def test_cancelled_aiohttp_request_is_aborted():
    async def scenario():
        async with SimServer(SimConfig(flavor="omlx", decode_ms_per_token=50, tokens=50)) as sim:
            async with aiohttp.ClientSession() as session:
                async def read_forever():
                    async with session.post(sim.url + "/v1/chat/completions", json={**BODY, "stream": True}) as r:
                        async for _ in r.content:
                            pass

                task = asyncio.create_task(read_forever())
                for _ in range(100):
                    if sim.stats()["in_flight"]:
                        break
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.1)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            for _ in range(100):
                if sim.stats()["aborted"]:
                    break
                await asyncio.sleep(0.01)
            return sim.stats()

    stats = asyncio.run(scenario())
    assert stats["aborted"] == 1 and stats["in_flight"] == 0
