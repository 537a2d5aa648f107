"""Real nodes as separate OS processes: `python -m hubpool_core.cli serve`, each with its own
data directory, recorded tailnet answer and loopback port, so a test can SIGKILL one for
real and start it again on the same port with the same data directory (its pairings live
in its database). Each process's stdout and stderr go to a file for debugging.

Only the world is simulated (engines, tailnet); the code under test is the code that ships.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from harness import ENGINE_VARS, closed_port_url, fqdn, tailnet_status_for

from hubpool_core.bench.procs import wait_http

P = "/api/inference/pool"
#: environment a child must not inherit: another node's settings, or a proxy that would
#: carry loopback traffic somewhere else
_DROP_PREFIXES = ("HUB_POOL_", "TAILSCALE_")
_DROP_NAMES = {"http_proxy", "https_proxy", "all_proxy", "no_proxy"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVE = ["-m", "hubpool_core.cli", "serve", "--log-level", "info"]
#: a warm spare: a fresh interpreter that has done the imports a cold start spends its seconds
#: on (2+ s of CPU, far more on a busy two-core machine), then waits for one line on stdin and
#: runs exactly what `python -m hubpool_core.cli serve` runs. The node itself (its database,
#: keys, routing log, socket) is built only after "go".
WARM_LAUNCHER = """
import sys
import hubpool_core.cli.main as cli
import hubpool_core.node.server  # noqa: F401 - what `serve` imports lazily
if sys.stdin.readline().strip() != "go":
    sys.exit(0)
sys.argv = ["hubpool", "serve", "--log-level", "info"]
cli.main()
"""


class NodeProcess:
    """One `hubpool serve` process. ``start`` may be called again after ``kill``: the same
    port, data directory and environment. With ``warm`` the next process is spawned (and has
    imported everything) while this one runs, so a restart costs the node's own start-up,
    not the interpreter's imports."""

    def __init__(self, name: str, root: Path, port: int, environ: dict[str, str], warm: bool = False):
        self.name = name
        self.fqdn = fqdn(name)
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.data_dir = root / name
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = root / f"{name}.log"
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(_DROP_PREFIXES) and k.lower() not in _DROP_NAMES}
        dead = closed_port_url()
        base.update({var: dead for var in ENGINE_VARS})
        base.update({"HUB_POOL_DATA_DIR": str(self.data_dir), "HUB_POOL_LISTEN": f"127.0.0.1:{port}",
                     "PYTHONUNBUFFERED": "1",
                     # a Docker daemon on the test machine must not become a node's container source
                     "HUB_POOL_DOCKER_SOCKET": "/nonexistent/docker.sock"})
        base.update(environ)
        self.environ = base
        self.proc: subprocess.Popen | None = None
        self.spare: subprocess.Popen | None = None
        self.warm = warm
        self.boots = 0

    # -- lifecycle ----------------------------------------------------------------------

    def _spawn(self, args: list[str], stdin: int) -> subprocess.Popen:
        with open(self.log_path, "ab") as log:
            return subprocess.Popen([sys.executable, *args], env=self.environ, cwd=str(self.data_dir.parent),
                                    stdin=stdin, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def start(self, ready_timeout: float = 20.0) -> NodeProcess:
        self.launch()
        self.wait_ready(ready_timeout)
        if self.warm:
            self.spare = self._spawn(["-c", WARM_LAUNCHER], subprocess.PIPE)
        return self

    def launch(self) -> None:
        """Start the process without waiting for it to answer."""
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} is already running"
        self.boots += 1
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== boot {self.boots} at {time.time():.3f} =====\n".encode())
        if self.warm:
            spare, self.spare = self.spare, None
            if spare is None or spare.poll() is not None:
                spare = self._spawn(["-c", WARM_LAUNCHER], subprocess.PIPE)
            spare.stdin.write(b"go\n")
            spare.stdin.close()
            self.proc = spare
        else:
            self.proc = self._spawn(SERVE, subprocess.DEVNULL)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=1.0, trust_env=False) as c:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {self.proc.returncode} during start; "
                                       f"see {self.log_path}:\n{self.log_tail()}")
                try:
                    if c.get(self.url + P + "/identify").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} did not answer within {timeout}s; see {self.log_path}:\n"
                                       f"{self.log_tail()}")
                time.sleep(0.05)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown of any kind, as when a machine loses power."""
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)

    def stop(self, grace: float = 5.0) -> None:
        if self.spare is not None:
            if self.spare.poll() is None:
                os.kill(self.spare.pid, signal.SIGKILL)
            self.spare.wait(10)
            self.spare = None
        if not self.alive():
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -- the operator API ---------------------------------------------------------------

    @property
    def operator_key(self) -> str:
        return (self.data_dir / "operator.key").read_text().strip()

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.operator_key}"}

    def op(self, method: str, path: str, body: Any = None, expect: int | None = 200, timeout: float = 20) -> Any:
        with httpx.Client(base_url=self.url, timeout=timeout, trust_env=False, headers=self.headers()) as c:
            r = c.request(method, P + path, json=body)
        assert expect is None or r.status_code == expect, (self.name, method, path, r.status_code, r.text)
        return r.json()

    def peer_id(self, other: str) -> str:
        return next(p["id"] for p in self.op("GET", "/status")["peers"] if p["nodeFqdn"] == fqdn(other))


class SimProcess:
    """One `hubpool-sim` process on a fixed loopback port; kill/restart keeps the port."""

    def __init__(self, name: str, root: Path, args: list[str]):
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = args
        self.log_path = root / f"{name}.log"
        self.proc: subprocess.Popen | None = None
        self.stopped = False
        self.boots = 0

    def launch(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} is already running"
        self.boots += 1
        env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "hubpool_sim.cli", "--port", str(self.port), *self.args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.stopped = False

    def wait_ready(self, timeout: float = 20.0) -> None:
        assert self.proc is not None, f"{self.name} was never launched"
        wait_http(self.url + "/_sim/stats", self.proc, timeout, self.name, f"; see {self.log_path}")

    def start(self) -> SimProcess:
        self.launch()
        self.wait_ready()
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: every connection it held is cut by the kernel, as in a crash."""
        if self.alive():
            if self.stopped:
                os.kill(self.proc.pid, signal.SIGCONT)
            os.kill(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)

    def sigstop(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.stopped = True

    def sigcont(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)
        self.stopped = False

    def stats(self) -> dict[str, Any]:
        with httpx.Client(timeout=3.0, trust_env=False) as c:
            return c.get(self.url + "/_sim/stats").json()

    def control(self, method: str, path: str, body: Any = None) -> Any:
        with httpx.Client(timeout=3.0, trust_env=False) as c:
            r = c.request(method, self.url + path, json=body)
        assert r.status_code == 200, (self.name, path, r.status_code, r.text)
        return r.json()


def make_process_pool(root: Path, names: list[str], environ: dict[str, str] | None = None,
                      per_node: dict[str, dict[str, str]] | None = None,
                      settings: dict[str, Any] | None = None, warm: tuple[str, ...] = ()) -> dict[str, NodeProcess]:
    """Processes hub-a, hub-b, ... on loopback, each with its own data directory and recorded
    tailnet answer, every peer reachable through HUB_POOL_PEER_URLS. ``settings`` is written
    as each node's settings.json before its first start; the nodes named in ``warm`` restart
    from a warm spare. Not started."""
    ports = {name: free_port() for name in names}
    urls = {fqdn(n): f"http://127.0.0.1:{p}" for n, p in ports.items()}
    nodes = {}
    for name in names:
        status_file = root / f"{name}-tailscale.json"
        status_file.write_text(json.dumps(tailnet_status_for(name)))
        env = {"HUB_POOL_TAILSCALE_CLI": str(status_file), "HUB_POOL_PEER_URLS": json.dumps(urls)}
        env.update(environ or {})
        env.update((per_node or {}).get(name, {}))
        nodes[name] = NodeProcess(name, root, ports[name], env, warm=name in warm)
        if settings:
            (nodes[name].data_dir / "settings.json").write_text(json.dumps(settings))
    return nodes


def pair(nodes: dict[str, NodeProcess], x: str, y: str) -> None:
    """x asks y with a PIN minted on y; y's operator approves."""
    pin = nodes[y].op("POST", "/pairing-pin")["pin"]
    nodes[x].op("POST", "/peers/pair", {"nodeFqdn": fqdn(y), "pin": pin})
    nodes[y].op("POST", f"/peers/{fqdn(x)}/approve")


def _offers(peer: dict[str, Any], model: str | None) -> bool:
    caps = peer.get("lastCapabilities")
    if not isinstance(caps, dict):
        return False
    return model is None or any(b.get("healthy") and model in (b.get("modelsLoaded") or [])
                                for b in caps.get("backends") or [])


def wait_connected(nodes: dict[str, NodeProcess], timeout: float, model: str | None = None) -> None:
    """Until every node lists every other as connected with a capabilities snapshot (that
    offers ``model`` on a healthy engine, when named)."""
    deadline = time.monotonic() + timeout
    while True:
        missing = []
        for name, n in nodes.items():
            peers = {p["nodeFqdn"]: p for p in n.op("GET", "/status")["peers"]}
            for other in nodes:
                if other == name:
                    continue
                p = peers.get(fqdn(other))
                if p is None or p["status"] != "connected" or not _offers(p, model):
                    missing.append(f"{name}->{other}: {None if p is None else p['status']}")
        if not missing:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"peers not connected within {timeout}s: {missing}")
        time.sleep(0.25)
