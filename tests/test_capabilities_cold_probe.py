"""A peer's health poll meets this node's engine cold: the answer names the engine.

/capabilities caches this node's inventory for 20 s. When nothing is cached, the read used to
wait only placement's 500 ms budget, so an engine whose probe took longer (a loaded machine, a
slow disk, a model list being rebuilt) was advertised as no engine at all, and every peer
believed that until its next poll. The poll allows 15 s; the read now waits the probe out.
"""

from __future__ import annotations

import asyncio
from contextlib import ExitStack

import aiohttp
from aiohttp import web
from aiohttp_thread import ThreadedApp
from harness import make_pool, name_of, pair

from hubpool_sim import SimConfig, SimModel, run_in_thread

MODEL = "llama3.2:3b"
PROBE_DELAY_S = 2.0  # over the 500 ms placement budget, under the 5 s probe timeout


def slow_probes(upstream: str) -> web.Application:
    """A reverse proxy in front of an engine that holds every GET (the probes) for a while."""

    async def forward(request: web.Request) -> web.Response:
        if request.method == "GET":
            await asyncio.sleep(PROBE_DELAY_S)
        async with aiohttp.ClientSession() as s, s.request(
                request.method, upstream + request.path_qs, data=await request.read(),
                headers={"Content-Type": request.headers.get("Content-Type", "application/json")}) as r:
            return web.Response(status=r.status, body=await r.read(),
                                headers={"Content-Type": r.headers.get("Content-Type", "application/json")})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def test_a_peer_polling_an_engine_that_probes_slowly_is_told_its_model(tmp_path):
    with ExitStack() as stack:
        sim = stack.enter_context(run_in_thread(SimConfig(flavor="ollama", models=[SimModel(MODEL)])))
        slow = stack.enter_context(ThreadedApp(slow_probes(sim.url)))
        nodes = make_pool(tmp_path, ["hub-a", "hub-b"], per_node={"hub-b": {"OLLAMA_URL": slow.url}})
        for n in nodes.values():
            stack.callback(n.stop)
            n.start()
        a, b = nodes["hub-a"], nodes["hub-b"]
        pair(a, b)
        a.run(a.node.health.poll_once())  # one poll: the first read of hub-b's inventory, or close behind it
        with a.client(headers=a.headers()) as c:
            peer = next(p for p in c.get("/api/inference/pool/status").json()["peers"]
                        if p["nodeFqdn"] == name_of(b))
        backends = (peer.get("lastCapabilities") or {}).get("backends") or []
        assert any(MODEL in (bk.get("modelsLoaded") or []) and bk.get("healthy") for bk in backends), backends
