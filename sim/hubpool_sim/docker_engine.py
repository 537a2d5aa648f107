"""A fake Docker Engine: a real HTTP server on a Unix socket answering the three calls a
container-stats source makes (``GET /_ping``, ``GET /containers/json?all=1`` and
``GET /containers/{id}/stats?stream=false``) with the shapes dockerd answers, for tests of
hubpool's ``docker_stats`` plugin through running nodes.

``with run_docker_engine(tmp_path / "docker.sock", [FakeContainer("web", cpu_percent=50.0)])
as engine:`` serves until the block ends; ``engine.containers`` may be changed while it runs,
``engine.down`` makes every call a 500, ``engine.calls`` records the paths asked.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

#: dockerd's own cgroup-v2 numbers for one sample: ``system_cpu_usage`` grows by this many
#: nanoseconds per sample on a machine with ``ONLINE_CPUS`` CPUs
SYSTEM_DELTA_NS = 4_000_000_000
ONLINE_CPUS = 4


@dataclass
class FakeContainer:
    """One container. ``state`` as dockerd spells it (running, exited, paused, restarting,
    created); ``cpu_percent`` on docker's scale (100 = one whole CPU); ``memory_bytes`` is
    what ``docker stats`` shows (usage less the inactive file cache)."""

    name: str
    state: str = "running"
    cpu_percent: float = 0.0
    memory_bytes: int = 0
    cache_bytes: int = 64 * 2**20
    id: str = field(default="")

    def __post_init__(self) -> None:
        if not self.id:
            self.id = (self.name.encode().hex() + "0" * 64)[:64]


class FakeDockerEngine:
    def __init__(self, socket_path: Path, containers: list[FakeContainer]):
        self.socket_path = Path(socket_path)
        self.containers = list(containers)
        self.down = False
        self.calls: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        app = web.Application()
        app.router.add_get("/_ping", self._ping)
        app.router.add_get(r"/{version:(v[0-9.]+/)?}containers/json", self._list)
        app.router.add_get(r"/{version:(v[0-9.]+/)?}containers/{id}/stats", self._stats)
        self._runner = web.AppRunner(app)

    # -- dockerd's answers ---------------------------------------------------------

    async def _ping(self, request: web.Request) -> web.Response:
        self.calls.append(request.path_qs)
        if self.down:
            return web.Response(status=500, text="Internal Server Error")
        return web.Response(text="OK", headers={"Api-Version": "1.45", "Docker-Experimental": "false"})

    async def _list(self, request: web.Request) -> web.Response:
        self.calls.append(request.path_qs)
        if self.down:
            return web.json_response({"message": "dockerd is not answering"}, status=500)
        shown = self.containers if request.query.get("all") in ("1", "true") else \
            [c for c in self.containers if c.state == "running"]
        return web.json_response([{
            "Id": c.id, "Names": ["/" + c.name], "Image": "example/" + c.name + ":latest",
            "State": c.state, "Status": "Up 3 hours" if c.state == "running" else "Exited (0) 2 hours ago",
            "Labels": {"com.docker.compose.project": "apps"},
        } for c in shown])

    async def _stats(self, request: web.Request) -> web.Response:
        self.calls.append(request.path_qs)
        if self.down:
            return web.json_response({"message": "dockerd is not answering"}, status=500)
        c = next((c for c in self.containers if c.id.startswith(request.match_info["id"])), None)
        if c is None:
            return web.json_response({"message": f"No such container: {request.match_info['id']}"}, status=404)
        if c.state != "running":  # dockerd answers zeros for a stopped container
            return web.json_response({"read": "0001-01-01T00:00:00Z", "cpu_stats": {"cpu_usage": {"total_usage": 0},
                                      "online_cpus": 0}, "precpu_stats": {"cpu_usage": {"total_usage": 0}},
                                      "memory_stats": {}})
        # docker's formula: cpu% = container delta / system delta * online CPUs * 100
        cpu_delta = int(c.cpu_percent / 100 / ONLINE_CPUS * SYSTEM_DELTA_NS)
        pre_total, pre_system = 10_000_000_000, 900_000_000_000
        return web.json_response({
            "read": "2026-12-02T12:00:01.000000000Z", "preread": "2026-12-02T12:00:00.000000000Z",
            "name": "/" + c.name, "id": c.id,
            "cpu_stats": {"cpu_usage": {"total_usage": pre_total + cpu_delta},
                          "system_cpu_usage": pre_system + SYSTEM_DELTA_NS, "online_cpus": ONLINE_CPUS},
            "precpu_stats": {"cpu_usage": {"total_usage": pre_total}, "system_cpu_usage": pre_system,
                             "online_cpus": ONLINE_CPUS},
            "memory_stats": {"usage": c.memory_bytes + c.cache_bytes, "limit": 16 * 2**30,
                             "stats": {"inactive_file": c.cache_bytes, "anon": c.memory_bytes}},
        })

    # -- serving -------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._runner.setup())
        site = web.UnixSite(self._runner, str(self.socket_path))
        self._loop.run_until_complete(site.start())
        self._ready.set()
        self._loop.run_forever()

    def start(self) -> FakeDockerEngine:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fake Docker Engine did not start")
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self.socket_path.unlink(missing_ok=True)


@contextmanager
def run_docker_engine(socket_path: Path, containers: list[FakeContainer]) -> Iterator[FakeDockerEngine]:
    engine = FakeDockerEngine(socket_path, containers).start()
    try:
        yield engine
    finally:
        engine.stop()


def rollup(containers: list[FakeContainer]) -> dict[str, Any]:
    """What a container-stats source should report for ``containers``: the wire shape."""
    running = [c for c in containers if c.state == "running"]
    return {"running": len(running), "stopped": len(containers) - len(running), "total": len(containers),
            "cpuPercent": round(sum(c.cpu_percent for c in running), 2),
            "memoryBytes": sum(c.memory_bytes for c in running)}
