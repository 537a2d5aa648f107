"""vLLM's sleep mode as residency for predicted TTFT (against the simulator)."""

from __future__ import annotations

import httpx
from hubpool_vllm.engine import VllmEngine

from hubpool_core.engine import EngineConfig
from hubpool_core.testing import run
from hubpool_sim import SimConfig, SimModel, run_in_thread


def resident(url):
    async def read():
        async with httpx.AsyncClient(timeout=5) as http:
            return await VllmEngine(EngineConfig(url)).resident_models(http)
    return run(read())


def test_asleep_holds_nothing_awake_holds_what_it_lists_and_no_sleep_mode_is_unknown():
    with run_in_thread(SimConfig(flavor="vllm", models=[SimModel("q:7b")], sleeping=True)) as sim:
        assert resident(sim.url) == []
        sim.configure(sleeping=False)
        assert [m.id for m in resident(sim.url)] == ["q:7b"]
    with run_in_thread(SimConfig(flavor="vllm", models=[SimModel("q:7b")])) as sim:
        assert resident(sim.url) is None  # /is_sleeping not served: the inventory stands
