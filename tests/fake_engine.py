"""A fake engine plugin for core tests that run with zero installed plugins."""

from __future__ import annotations

import httpx

from hubpool_core import Engine, ModelInfo, ProbeResult, hookimpl


class FakeEngine(Engine):
    kind = "fake"
    env_var = "FAKE_ENGINE_URL"
    default_url = "http://127.0.0.1:9"

    async def probe(self, http: httpx.AsyncClient) -> ProbeResult:
        return ProbeResult(running=True, healthy=True, models=(ModelInfo("fake-model", context_window=4096),))


class FakeEnginePlugin:
    @staticmethod
    @hookimpl
    def hubpool_register_engines(register):
        """Register the fake engine."""
        register(FakeEngine)
