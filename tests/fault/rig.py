"""The fault rig: whole `hubpool serve` processes on loopback, each with its own simulated
engine as a separate `hubpool-sim` process (so a test can SIGKILL or SIGSTOP an engine for
real), health polls every second, and optional fault proxies on the hops between nodes.

Every loop here is bounded in count and in time; every process is ended by its own pid.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
from faultproxy import FaultProxy
from harness import fqdn
from process_harness import WARM_LAUNCHER, NodeProcess, SimProcess, make_process_pool, pair, wait_connected

MODEL = "llama3.2:3b"
P = "/api/inference/pool"
#: the environment every rig node gets: 1 s polls (HUB_POOL_DEV_HEALTH_POLL_SECONDS), a log that
#: holds the whole run, and a header floor low enough for budgets of a second or two
RIG_ENV = {"HUB_POOL_DEV_HEALTH_POLL_SECONDS": "1", "HUB_POOL_ROUTING_LOG_SIZE": "10000",
           "HUB_POOL_DEV_FIRST_BYTE_FLOOR_MS": "500"}


def sim_args(ms_per_token: float = 0, tokens: int = 8, slots: int = 64, prefill_tps: float = 0,
             models: Iterable[str] = (MODEL,)) -> list[str]:
    args = ["--flavor", "ollama", "--slots", str(slots), "--tokens", str(tokens), "--no-prompt-cache"]
    for m in models:
        args += ["--model", m, "--preload", m]
    if ms_per_token:
        args += ["--decode-ms-per-token", str(ms_per_token)]
    if prefill_tps:
        args += ["--prefill-tps", str(prefill_tps)]
    return args


class Rig:
    """Nodes ``names`` (hub-a, hub-b, ...), one simulated Ollama each, all paired with each
    other. ``proxied`` lists (from, to) hops that go through a FaultProxy: ``from`` dials
    ``to`` at the proxy, so toxics act on what ``to`` sends back to ``from``."""

    def __init__(self, root: Path, names: list[str], sim: list[str] | None = None,
                 env: dict[str, str] | None = None, per_node: dict[str, dict[str, str]] | None = None,
                 proxied: Iterable[tuple[str, str]] = (), warm: tuple[str, ...] = ()):
        self.root = root
        self.names = names
        self.sims = {n: SimProcess(f"{n}-engine", root, sim if sim is not None else sim_args()) for n in names}
        per = {n: {"OLLAMA_URL": self.sims[n].url, **(per_node or {}).get(n, {})} for n in names}
        self.nodes: dict[str, NodeProcess] = make_process_pool(root, names, environ={**RIG_ENV, **(env or {})},
                                                               per_node=per, warm=warm)
        self.fqdns = {n: fqdn(n) for n in names}
        self.proxies: dict[tuple[str, str], FaultProxy] = {}
        for src, dst in proxied:
            proxy = FaultProxy(self.nodes[dst].port).start()
            self.proxies[(src, dst)] = proxy
            urls = json.loads(self.nodes[src].environ["HUB_POOL_PEER_URLS"])
            urls[fqdn(dst)] = proxy.url
            self.nodes[src].environ["HUB_POOL_PEER_URLS"] = json.dumps(urls)
        self.setup_s = 0.0

    def start(self, connect_timeout: float = 60.0) -> Rig:
        t0 = time.monotonic()
        for s in self.sims.values():
            s.launch()
        for n in self.nodes.values():
            n.launch()
        for s in self.sims.values():
            s.wait_ready()
        for n in self.nodes.values():
            n.wait_ready(40)
            if n.warm and n.spare is None:  # what NodeProcess.start does after its first boot
                n.spare = n._spawn(["-c", WARM_LAUNCHER], subprocess.PIPE)  # noqa: SLF001
        for x, y in itertools.combinations(self.names, 2):
            pair(self.nodes, x, y)
        wait_connected(self.nodes, timeout=connect_timeout, model=MODEL)
        self.setup_s = time.monotonic() - t0
        return self

    def close(self) -> None:
        for n in self.nodes.values():
            try:
                n.stop(grace=3)
            except Exception:  # noqa: BLE001 - keep stopping the rest
                n.kill()
        for s in self.sims.values():
            s.kill()
        for p in self.proxies.values():
            p.stop()

    def __enter__(self) -> Rig:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- reading the nodes ----------------------------------------------------------------

    def log(self, name: str) -> list[dict[str, Any]]:
        return self.nodes[name].op("GET", "/routing-log?limit=10000")["entries"]

    def logs(self, names: Iterable[str] | None = None, settle_s: float = 10.0) -> dict[str, list[dict]]:
        """Every node's whole routing log, read once no row is pending (bounded by ``settle_s``)."""
        from history import wait_settled

        return {n: wait_settled(lambda n=n: self.log(n), settle_s) for n in (names or self.names)}

    def peer(self, observer: str, name: str) -> dict[str, Any]:
        return next(p for p in self.nodes[observer].op("GET", "/status")["peers"] if p["nodeFqdn"] == fqdn(name))

    def metrics(self, name: str) -> str:
        with httpx.Client(timeout=5, trust_env=False) as c:
            return c.get(self.nodes[name].url + "/metrics").text


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus sample family's values whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        if head != name and not head.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def chat_body(route: str, tag: str, stream: bool = True, model: str = MODEL) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": f"{tag}. Answer briefly."}], "stream": stream}


def upstream_sockets(pid: int, port: int) -> int:
    """Established TCP connections process ``pid`` holds to loopback ``port`` (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            remote, state, inode = parts[2], parts[3], parts[9]
            if state == "01" and inode in inodes and int(remote.rsplit(":", 1)[1], 16) == port:
                count += 1
    return count
