"""Container counts, CPU and memory from Docker's Engine API over its Unix socket.

The socket is ``HUB_POOL_DOCKER_SOCKET`` when set, else the path of a ``unix://`` value of
``DOCKER_HOST``, else ``/var/run/docker.sock``. The source is off unless that path exists
and is a socket: it then answers ``None`` (not reported) without a call, so a machine
without Docker costs one ``stat`` a minute. With it, one sample is ``GET
/containers/json?all=1`` and, for each running container, ``GET
/containers/{id}/stats?stream=false`` (dockerd waits about a second to take its two CPU
readings, so the per-container calls run side by side, at most :data:`MAX_PARALLEL` at once).

Scope is every container the daemon reports, or only those carrying the label
``HUB_POOL_DOCKER_LABEL`` names (``com.docker.compose.project`` for compose projects).
Counts and sums only: no container name or id leaves this module (spec: "Container counts").

Everything that is not running — exited, paused, restarting, created — counts as stopped.
``cpuPercent`` is docker's own figure summed over running containers (100 = one CPU), and
``memoryBytes`` what ``docker stats`` shows (usage less the inactive file cache). Any
failure — dockerd down, a timeout, an answer that is not the expected JSON, a container's
stats missing — answers ``None`` for the whole sample rather than a partial sum that reads
as measured; the sampler then reports nothing once its last good sample ages out.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import stat
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/run/docker.sock"
SOCKET_VAR = "HUB_POOL_DOCKER_SOCKET"
LABEL_VAR = "HUB_POOL_DOCKER_LABEL"
TIMEOUT_S = 5.0
MAX_PARALLEL = 8
#: a sample never asks for more containers' stats than this (a runaway host stays cheap)
MAX_STATS_CALLS = 256


class DockerUnavailable(Exception):
    """A failed Engine API call; its message is a sentence for the log."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def socket_path(environ: dict[str, str]) -> str:
    explicit = environ.get(SOCKET_VAR, "").strip()
    if explicit:
        return explicit
    host = environ.get("DOCKER_HOST", "").strip()
    if host.startswith("unix://"):
        return host[len("unix://"):]
    return DEFAULT_SOCKET


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


class DockerStats:
    """The container-stats callable: ``DockerStats(env)()`` is one sample, or ``None``."""

    name = "docker_stats"

    def __init__(self, env: Any) -> None:
        environ_of = getattr(env, "environ", None)
        environ = environ_of() if callable(environ_of) else dict(os.environ)
        self.socket = socket_path(environ)
        self.label = environ.get(LABEL_VAR, "").strip() or None
        self.timeout = TIMEOUT_S
        self._last_error: str | None = None

    def __call__(self) -> dict[str, Any] | None:
        if not _is_socket(self.socket):
            return None  # no Docker here: off, and no call made
        try:
            sample = self.sample()
        except DockerUnavailable as exc:
            self._report(str(exc))
            return None
        if self._last_error is not None:
            log.info("docker_stats: %s answers again", self.socket)
            self._last_error = None
        return sample

    def _report(self, why: str) -> None:
        # once when it starts or changes, then debug: the sampler asks every minute
        log.log(logging.WARNING if why != self._last_error else logging.DEBUG, "docker_stats: %s", why)
        self._last_error = why

    # -- one sample ------------------------------------------------------------------

    def sample(self) -> dict[str, Any]:
        query = "all=1"
        if self.label:
            query += "&filters=" + quote(json.dumps({"label": [self.label]}), safe="")
        listed = self._get("/containers/json?" + query)
        if not isinstance(listed, list) or not all(isinstance(c, dict) for c in listed):
            raise DockerUnavailable(f"{self.socket}: the container list is not a JSON array of objects")
        running = [c for c in listed if c.get("State") == "running"]
        ids = [c.get("Id") for c in running]
        if not all(isinstance(i, str) and i for i in ids):
            raise DockerUnavailable(f"{self.socket}: a running container has no Id")
        if len(ids) > MAX_STATS_CALLS:
            raise DockerUnavailable(f"{self.socket}: {len(ids)} running containers, more than this source samples "
                                    f"({MAX_STATS_CALLS})")
        cpu, memory = 0.0, 0
        if ids:
            with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(ids))) as pool:
                for c_cpu, c_memory in pool.map(self._usage, ids):
                    cpu += c_cpu
                    memory += c_memory
        return {"running": len(running), "stopped": len(listed) - len(running), "total": len(listed),
                "cpuPercent": round(cpu, 2), "memoryBytes": memory}

    def _usage(self, container_id: str) -> tuple[float, int]:
        stats = self._get(f"/containers/{quote(container_id, safe='')}/stats?stream=false")
        if not isinstance(stats, dict):
            raise DockerUnavailable(f"{self.socket}: a container's stats are not a JSON object")
        return cpu_percent(stats), memory_bytes(stats)

    def _get(self, path: str) -> Any:
        conn = _UnixConnection(self.socket, self.timeout)
        try:
            conn.request("GET", path, headers={"Accept": "application/json"})
            response = conn.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise DockerUnavailable(f"{self.socket}: {type(exc).__name__} ({exc})") from None
        finally:
            conn.close()
        if response.status != 200:
            raise DockerUnavailable(f"{self.socket}: {path.split('?')[0]} answered HTTP {response.status}")
        try:
            return json.loads(body)
        except ValueError:
            raise DockerUnavailable(f"{self.socket}: {path.split('?')[0]} answered something that is not JSON") \
                from None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def cpu_percent(stats: dict[str, Any]) -> float:
    """docker's own formula (``docker stats``): the container's CPU delta over the host's, times
    the online CPUs, as a percent; 0 when either delta is missing or not positive."""
    cur, pre = stats.get("cpu_stats"), stats.get("precpu_stats")
    if not isinstance(cur, dict) or not isinstance(pre, dict):
        return 0.0
    usage, pre_usage = cur.get("cpu_usage"), pre.get("cpu_usage")
    total = _number(usage.get("total_usage")) if isinstance(usage, dict) else None
    pre_total = _number(pre_usage.get("total_usage")) if isinstance(pre_usage, dict) else None
    system, pre_system = _number(cur.get("system_cpu_usage")), _number(pre.get("system_cpu_usage"))
    if None in (total, pre_total, system, pre_system):
        return 0.0
    assert total is not None and pre_total is not None and system is not None and pre_system is not None
    cpu_delta, system_delta = total - pre_total, system - pre_system
    if cpu_delta <= 0 or system_delta <= 0:
        return 0.0
    online = _number(cur.get("online_cpus"))
    if not online:
        per_cpu = usage.get("percpu_usage") if isinstance(usage, dict) else None
        online = float(len(per_cpu)) if isinstance(per_cpu, list) and per_cpu else 1.0
    return cpu_delta / system_delta * online * 100.0


def memory_bytes(stats: dict[str, Any]) -> int:
    """Usage less the inactive file cache, as ``docker stats`` shows it (cgroup v2's
    ``inactive_file``, v1's ``total_inactive_file``); 0 when not reported."""
    mem = stats.get("memory_stats")
    if not isinstance(mem, dict):
        return 0
    usage = _number(mem.get("usage"))
    if usage is None:
        return 0
    detail = mem.get("stats") if isinstance(mem.get("stats"), dict) else {}
    cache = _number(detail.get("inactive_file"))
    if cache is None:
        cache = _number(detail.get("total_inactive_file")) or 0.0
    return int(max(0.0, usage - cache)) if cache < usage else int(usage)
