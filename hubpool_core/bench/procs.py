"""The processes a benchmark starts: the stub engine, nginx, hubpool nodes and the load
generator, each in its own session so it can be stopped by its own id and nothing else.

CPU and memory are read from /proc (no psutil): every thread's run time from schedstat
(nanoseconds; ``utime + stime`` of /proc/<pid>/stat where the kernel keeps none), and VmRSS
of /proc/<pid>/status for resident memory.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

P = "/api/inference/pool"
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
#: a child node must not inherit another node's settings, nor a proxy that would carry
#: loopback traffic elsewhere
_DROP_PREFIXES = ("HUB_POOL_", "TAILSCALE_")
_DROP_NAMES = {"http_proxy", "https_proxy", "all_proxy", "no_proxy"}
SUFFIX = "bench.ts.net"


@dataclass(frozen=True)
class CpuSample:
    """One reading of a process's CPU: each live thread's run time (ns, from schedstat) and the
    whole process's utime + stime (seconds, 10 ms ticks, threads that ended included)."""

    threads: dict[str, int]
    coarse: float


def cpu_sample(pid: int) -> CpuSample:
    """The process's CPU now; empty once it is gone."""
    threads: dict[str, int] = {}
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                threads[task] = int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # a thread that ended between the listing and the read
    except OSError:
        return CpuSample({}, 0.0)
    return CpuSample(threads, _stat_seconds(pid))


#: how far the tick count may run ahead of the threads' own figures before it is believed
_TICK_SLACK_S = 3 / _CLK_TCK


def cpu_used(before: CpuSample, after: CpuSample) -> float:
    """CPU seconds between two samples of one process.

    The threads' schedstat run times are nanosecond-exact (utime + stime tick at 10 ms, coarser
    than nginx spends on a thousand requests) but a thread that ended took its time with it —
    a server whose worker threads come and go (LiteLLM's) read low, even negative. So: each
    thread alive at the end, from its own start figure (0 if it was born since); and when the
    process's tick count says clearly more was used, threads that ended used it: the ticks."""
    if not after.threads:
        return 0.0
    exact = sum(ns - before.threads.get(tid, 0) for tid, ns in after.threads.items()) / 1e9
    coarse = after.coarse - before.coarse
    return coarse if coarse - exact > _TICK_SLACK_S else exact


def cpu_seconds(pid: int) -> float:
    """CPU seconds the process (all its live threads) has used; 0 once it is gone. For a
    difference over a run use :func:`cpu_sample` and :func:`cpu_used`."""
    sample = cpu_sample(pid)
    return sum(sample.threads.values()) / 1e9 if sample.threads else 0.0


def _stat_seconds(pid: int) -> float:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = raw[raw.rindex(")") + 2:].split()
    # fields now start at the state (field 3): utime is field 14, stime field 15
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def rss_mb(pid: int) -> float | None:
    """Resident memory in MB, or None when the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment minus anything that would reconfigure a child node."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_DROP_PREFIXES) and k.lower() not in _DROP_NAMES}
    env.update(extra)
    return env


class JsonLineProcess:
    """A helper process driven over its pipes: one JSON job line in, one JSON result line out."""

    def __init__(self, started: Started, name: str, module: str):
        self.name = name
        self.proc = started.start(name, [sys.executable, "-m", module], env=child_env({}), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE)

    def ask(self, job: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write((json.dumps(job) + "\n").encode())
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} process exited")
        return json.loads(line)


class Started:
    """The processes one benchmark started; ``stop_all`` ends exactly those."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None,
              stdin: Any = subprocess.DEVNULL, stdout: Any = None) -> subprocess.Popen:
        """Start ``argv`` in its own session; its output goes to <workdir>/<name>.log."""
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(argv, env=env, cwd=str(self.workdir), stdin=stdin,
                                stdout=stdout if stdout is not None else log, stderr=log,
                                start_new_session=True)
        self.procs[name] = proc
        return proc

    def log_tail(self, name: str, lines: int = 20) -> str:
        try:
            text = (self.workdir / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=5)


def wait_http(url: str, proc: subprocess.Popen, timeout: float, what: str, log: str = "") -> None:
    """Until GET ``url`` answers 200; a process that exits or a timeout raises RuntimeError."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=2.0, trust_env=False) as c:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode} during start{log}")
            try:
                if c.get(url).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not answer within {timeout:.0f} s{log}")
            time.sleep(0.05)


# -- the stub engine ------------------------------------------------------------------

def start_stub(started: Started, pace_ms: float, tokens: int, name: str = "stub",
               version: str = "0.0.0-bench") -> tuple[str, subprocess.Popen]:
    """The stub engine on a free loopback port: its base URL and process. ``version`` is
    what its /api/version says (see hubpool_core/bench/stub_engine.py)."""
    port = free_port()
    proc = started.start(name, [sys.executable, "-m", "hubpool_core.bench.stub_engine", "--port", str(port),
                                "--pace-ms", str(pace_ms), "--tokens", str(tokens), "--version", version],
                         env=child_env({}))
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/v1/models", proc, 30, "the stub engine", "\n" + started.log_tail(name))
    return url, proc


# -- nginx ----------------------------------------------------------------------------

#: one nginx process in the foreground, everything under ``{run}``; the ``http`` block stays open
NGINX_HEAD = """master_process off;
daemon off;
worker_processes 1;
pid {run}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {run}/body;
    proxy_temp_path {run}/proxy;
    fastcgi_temp_path {run}/fastcgi;
    uwsgi_temp_path {run}/uwsgi;
    scgi_temp_path {run}/scgi;
"""
# a plain reverse proxy: the best one extra hop does (one process, as a node is one)
NGINX_CONF = NGINX_HEAD + """\
    keepalive_requests 1000000;
    upstream engine {{
        server {upstream};
        keepalive 256;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=2048;
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_cache off;
            proxy_read_timeout 300s;
        }}
    }}
}}
"""


def nginx_path() -> str | None:
    """nginx on PATH (or in the Debian package's sbin), else None."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")


def start_nginx(started: Started, binary: str, upstream: str) -> tuple[str, subprocess.Popen]:
    """nginx in front of ``upstream`` (host:port) on a free port: its base URL and process."""
    run = started.workdir / "nginx"
    run.mkdir(exist_ok=True)
    port = free_port()
    conf = run / "nginx.conf"
    conf.write_text(NGINX_CONF.format(run=run, upstream=upstream, port=port))
    proc = started.start("nginx", [binary, "-p", str(run), "-c", str(conf), "-e", "stderr"])
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/v1/models", proc, 20, "nginx", "\n" + started.log_tail("nginx"))
    return url, proc


# -- hubpool nodes --------------------------------------------------------------------

def tailnet_status(me: str, names: list[str]) -> dict[str, Any]:
    """A recorded `tailscale status --json` answer as node ``me`` of ``names`` sees it."""

    def device(i: int, name: str) -> dict[str, Any]:
        return {"ID": f"bench{i}", "HostName": name, "DNSName": f"{name}.{SUFFIX}.", "OS": "linux",
                "Online": True, "TailscaleIPs": [f"100.64.0.{i + 1}"]}

    everyone = {name: device(i, name) for i, name in enumerate(names)}
    return {"BackendState": "Running", "Self": everyone[me], "MagicDNSSuffix": SUFFIX,
            "CurrentTailnet": {"Name": "bench", "MagicDNSSuffix": SUFFIX, "MagicDNSEnabled": True},
            "Peer": {f"nodekey:{n}": d for n, d in everyone.items() if n != me}}


def fqdn(name: str) -> str:
    """A bench node's tailnet name."""
    return f"{name}.{SUFFIX}"


class BenchNode:
    """One `hubpool serve` process with its own data directory."""

    def __init__(self, name: str, url: str, proc: subprocess.Popen, data_dir: Path):
        self.name, self.url, self.proc, self.data_dir = name, url, proc, data_dir

    @property
    def operator_key(self) -> str:
        return (self.data_dir / "operator.key").read_text().strip()

    def op(self, method: str, path: str, body: Any = None, expect: int = 200) -> Any:
        """One operator call; an unexpected status raises RuntimeError with the answer."""
        with httpx.Client(base_url=self.url, timeout=30, trust_env=False,
                          headers={"Authorization": f"Bearer {self.operator_key}"}) as c:
            r = c.request(method, P + path, json=body)
        if r.status_code != expect:
            raise RuntimeError(f"{self.name}: {method} {path} answered {r.status_code}: {r.text[:300]}")
        return r.json()


#: the settings a bench node starts with. The local engines' health is read from a 10 s
#: snapshot (the value the spec validates it at) rather than probed live on every request,
#: the default that keeps a node that took the image untouched byte for byte as before:
#: a live probe of every installed engine per request measures the probes, not the relay.
BENCH_SETTINGS = {"poolProbeSnapshotTtlMs": 10_000}


def start_nodes(started: Started, specs: dict[str, dict[str, str]], engine_vars: list[str],
                routing_log_size: int = 10_000, settings: dict[str, Any] | None = None,
                node_settings: dict[str, dict[str, Any]] | None = None,
                start_timeout: float = 60.0) -> dict[str, BenchNode]:
    """`hubpool serve` processes named by ``specs`` (name -> extra environment), every engine
    variable in ``engine_vars`` pointed at a closed port unless the spec names it, each
    starting with ``settings`` (default :data:`BENCH_SETTINGS`), or with its own from
    ``node_settings`` (name -> settings) when that names it."""
    names = list(specs)
    ports = {name: free_port() for name in names}
    peer_urls = json.dumps({fqdn(n): f"http://127.0.0.1:{p}" for n, p in ports.items()})
    procs = {}
    for name in names:
        data_dir = started.workdir / name
        data_dir.mkdir(exist_ok=True)
        own = (node_settings or {}).get(name)
        chosen = own if own is not None else BENCH_SETTINGS if settings is None else settings
        (data_dir / "settings.json").write_text(json.dumps(chosen))
        status_file = started.workdir / f"{name}-tailscale.json"
        status_file.write_text(json.dumps(tailnet_status(name, names)))
        env = {var: f"http://127.0.0.1:{free_port()}" for var in engine_vars}
        env.update({"HUB_POOL_DATA_DIR": str(data_dir), "HUB_POOL_LISTEN": f"127.0.0.1:{ports[name]}",
                    "HUB_POOL_TAILSCALE_CLI": str(status_file), "HUB_POOL_PEER_URLS": peer_urls,
                    "HUB_POOL_ROUTING_LOG_SIZE": str(routing_log_size), "PYTHONUNBUFFERED": "1"})
        env.update(specs[name])
        procs[name] = started.start(name, [sys.executable, "-m", "hubpool_core.cli", "serve", "--log-level",
                                           "warning"], env=child_env(env))
    nodes = {}
    for name in names:
        url = f"http://127.0.0.1:{ports[name]}"
        wait_http(url + P + "/identify", procs[name], start_timeout, f"hubpool node {name}",
                  "\n" + started.log_tail(name))
        nodes[name] = BenchNode(name, url, procs[name], started.workdir / name)
    return nodes


def pair(requester: BenchNode, approver: BenchNode) -> None:
    """Pair as an operator does: a PIN minted on the approver, asked by the requester, approved."""
    pin = approver.op("POST", "/pairing-pin")["pin"]
    requester.op("POST", "/peers/pair", {"nodeFqdn": fqdn(approver.name), "pin": pin})
    approver.op("POST", f"/peers/{fqdn(requester.name)}/approve")


def wait_offered(node: BenchNode, peer: BenchNode, model: str, timeout: float) -> None:
    """Until ``node`` lists ``peer`` connected with ``model`` on a healthy engine."""
    deadline = time.monotonic() + timeout
    while True:
        for p in node.op("GET", "/status")["peers"]:
            caps = p.get("lastCapabilities")
            if p["nodeFqdn"] == fqdn(peer.name) and p["status"] == "connected" and isinstance(caps, dict) and any(
                    b.get("healthy") and model in (b.get("modelsLoaded") or []) for b in caps.get("backends") or []):
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{node.name} did not see {peer.name} offer {model} within {timeout:.0f} s")
        time.sleep(0.25)
