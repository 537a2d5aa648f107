"""llama-server's memory state for predicted TTFT: router mode's /models status, else the
one model a classic server holds (against the simulator)."""

from __future__ import annotations

import httpx
from hubpool_llamacpp.engine import LlamacppEngine

from hubpool_core.engine import EngineConfig
from hubpool_core.testing import run
from hubpool_sim import SimConfig, SimModel, run_in_thread


def resident(url):
    async def read():
        async with httpx.AsyncClient(timeout=5) as http:
            return await LlamacppEngine(EngineConfig(url)).resident_models(http)
    return run(read())


def test_router_mode_lists_the_loaded_models_only():
    config = SimConfig(flavor="llamacpp", router=True, models=[SimModel("a:1b"), SimModel("b:1b")], preloaded=["b:1b"])
    with run_in_thread(config) as sim:
        assert [m.id for m in resident(sim.url)] == ["b:1b"]
        httpx.post(sim.url + "/v1/chat/completions", json={"model": "a:1b", "messages": [{"role": "user", "content": "x"}]})
        assert sorted(m.id for m in resident(sim.url)) == ["a:1b", "b:1b"]


def test_a_classic_server_holds_its_model_and_a_dead_one_says_nothing():
    with run_in_thread(SimConfig(flavor="llamacpp", models=[SimModel("a:1b")])) as sim:
        assert [m.id for m in resident(sim.url)] == ["a:1b"]
    assert resident("http://127.0.0.1:9") is None
