"""``hubpool bench mesh``: the pool at the size its users run it.

N `hubpool serve` processes on loopback, each beside its own simulated engine (all N engines
live in one helper process: an idle engine costs nothing, and forty interpreters on a
two-core box would measure the box), paired as a full mesh through the operator API with a
PIN, as an operator would. Every node serves a different model mix: one model all of them
hold, one of a rotating family, one only it holds; and the first two nodes share a model
nobody else has. Measured, in this order:

1. pairing: the N(N-1)/2 PIN pairings, and until every node reads every other connected
   with a capabilities snapshot;
2. idle: each node's CPU (every thread's schedstat, see :mod:`procs`) and resident memory
   over a window of whole poll intervals with nothing sent to any node;
3. placement: the entry node's CPU per request for a model all N nodes offer (N candidates)
   against the model only two offer (2 candidates), interleaved;
4. a node's death (SIGKILL): until every other node reads it unreachable, then restarted on
   the same port and data directory, until every other node reads it connected again;
5. a mixed load from every node (streamed and not, models held everywhere, somewhere, and
   only on one other node), the client's history reconciled with every routing log: one
   outbound row per request on the node it entered, served where the client was told, an
   inbound row under the same id on the peer that served it, no row nobody sent.

Every process started here is ended by its own id (``procs.Started``).
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from hubpool_core.bench import procs

P = "/api/inference/pool"
#: every node holds this one: placement sees N candidates
COMMON = "llama3.2:3b"
#: only the first two nodes hold this one: placement sees 2 candidates
DUO = "duo-mesh:1b"
#: node i also holds FAMILY[i % len(FAMILY)] and its own unique model
FAMILY = ("qwen3:8b", "gemma3:4b", "mistral:7b", "phi4:14b", "deepseek-r1:7b")
#: the node's default poll interval (settings: poolHealthPollSeconds); a node reads a peer
#: unreachable after three failed polls
DEFAULT_POLL_S = 30
UNREACHABLE_POLLS = 3
#: nodes started at once: a node's start is seconds of CPU, so not twenty together
START_WAVE = 5

#: the helper process that runs every simulated engine, one thread each
SIM_HOST = """
import json, sys, time
from hubpool_sim import SimConfig, SimModel
from hubpool_sim.server import ThreadedSimServer
servers = []
for spec in json.loads(sys.argv[1]):
    cfg = SimConfig(flavor=spec["flavor"], port=spec["port"], slots=8, tokens=8, prompt_cache=False,
                    models=[SimModel(m, 8192) for m in spec["models"]], preloaded=list(spec["models"]))
    servers.append(ThreadedSimServer(cfg, "127.0.0.1", spec["port"]).start())
print("ready", flush=True)
sys.stdin.read()
"""


def unique_model(i: int) -> str:
    return f"mesh-{i:02d}:1b"


def model_mix(i: int) -> list[str]:
    """What node ``i`` serves: different on every node."""
    mix = [COMMON, FAMILY[i % len(FAMILY)], unique_model(i)]
    if i < 2:
        mix.append(DUO)
    return mix


@dataclass
class Op:
    """One client request of the mixed load, as the client saw it."""

    entry: str
    model: str
    stream: bool
    status: int | None = None
    rid: str | None = None
    served_by: str | None = None
    whole: bool = False
    error: str | None = None


@dataclass
class MeshReport:
    nodes: int
    poll_s: int
    figures: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "pollSeconds": self.poll_s, **self.figures, "problems": self.problems,
                "ok": not self.problems}


class Mesh:
    """The N nodes and their engines; ``close`` ends every process it started."""

    def __init__(self, workdir: Path, n: int, poll_s: int, progress: Callable[[str], None]):
        from hubpool_core.bench.pool import engine_choice

        self.workdir, self.n, self.poll_s, self.progress = workdir, n, poll_s, progress
        self.started = procs.Started(workdir)
        self.names = [f"m{i:02d}" for i in range(n)]
        # the engine that reports residency and slots, chosen by capability (the core names none)
        _, _, self.kind, self.engine_var, self.all_vars = engine_choice()
        self.sim_ports = {name: procs.free_port() for name in self.names}
        self.ports = {name: procs.free_port() for name in self.names}
        self.envs: dict[str, dict[str, str]] = {}
        self.nodes: dict[str, procs.BenchNode] = {}
        self.sim_proc: subprocess.Popen | None = None

    # -- processes ------------------------------------------------------------------------

    def start_engines(self) -> None:
        specs = [{"flavor": self.kind, "port": self.sim_ports[name], "models": model_mix(i)}
                 for i, name in enumerate(self.names)]
        self.sim_proc = self.started.start("engines", [sys.executable, "-c", SIM_HOST, json.dumps(specs)],
                                           env=procs.child_env({}), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.sim_proc.stdout is not None
        line = self.sim_proc.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError("the simulated engines did not start:\n" + self.started.log_tail("engines"))

    def _env(self, name: str) -> dict[str, str]:
        data_dir = self.workdir / name
        data_dir.mkdir(exist_ok=True)
        status_file = self.workdir / f"{name}-tailscale.json"
        status_file.write_text(json.dumps(procs.tailnet_status(name, self.names)))
        peer_urls = json.dumps({procs.fqdn(n): f"http://127.0.0.1:{p}" for n, p in self.ports.items()})
        env = {var: f"http://127.0.0.1:{procs.free_port()}" for var in self.all_vars}
        env.update({self.engine_var: f"http://127.0.0.1:{self.sim_ports[name]}", "HUB_POOL_DATA_DIR": str(data_dir),
                    "HUB_POOL_LISTEN": f"127.0.0.1:{self.ports[name]}", "HUB_POOL_TAILSCALE_CLI": str(status_file),
                    "HUB_POOL_PEER_URLS": peer_urls, "PYTHONUNBUFFERED": "1"})
        if self.poll_s != DEFAULT_POLL_S:
            env["HUB_POOL_DEV_HEALTH_POLL_SECONDS"] = str(self.poll_s)
        return procs.child_env(env)

    def launch(self, name: str) -> subprocess.Popen:
        self.envs.setdefault(name, self._env(name))
        return self.started.start(name, [sys.executable, "-m", "hubpool_core.cli", "serve", "--log-level",
                                         "warning"], env=self.envs[name])

    def wait_up(self, name: str, proc: subprocess.Popen, timeout: float = 180) -> None:
        url = f"http://127.0.0.1:{self.ports[name]}"
        procs.wait_http(url + P + "/identify", proc, timeout, f"hubpool node {name}",
                        "\n" + self.started.log_tail(name))
        self.nodes[name] = procs.BenchNode(name, url, proc, self.workdir / name)

    def start_nodes(self) -> None:
        for at in range(0, self.n, START_WAVE):
            wave = self.names[at:at + START_WAVE]
            self.progress(f"starting nodes {wave[0]}..{wave[-1]}")
            started = {name: self.launch(name) for name in wave}
            for name, proc in started.items():
                self.wait_up(name, proc)

    def close(self) -> None:
        if self.sim_proc is not None and self.sim_proc.stdin is not None:
            try:
                self.sim_proc.stdin.close()
            except OSError:
                pass
        self.started.stop_all()

    # -- reading the nodes ----------------------------------------------------------------

    def peers(self, name: str) -> dict[str, dict[str, Any]]:
        return {p["nodeFqdn"]: p for p in self.nodes[name].op("GET", "/status")["peers"]}

    def missing_links(self, watchers: list[str], targets: list[str], want: str) -> list[str]:
        """``watcher->target`` for every link not yet in state ``want`` (connected: with a
        capabilities snapshot offering the target's own model on a healthy engine)."""
        missing = []
        for w in watchers:
            seen = self.peers(w)
            for t in targets:
                if t == w:
                    continue
                p = seen.get(procs.fqdn(t))
                if p is None or p["status"] != want:
                    missing.append(f"{w}->{t}")
                elif want == "connected":
                    caps = p.get("lastCapabilities") or {}
                    own = unique_model(self.names.index(t))
                    if not any(b.get("healthy") and own in (b.get("modelsLoaded") or [])
                               for b in caps.get("backends") or []):
                        missing.append(f"{w}->{t}")
        return missing

    def wait_links(self, watchers: list[str], targets: list[str], want: str, timeout: float,
                   per_watcher: dict[str, float] | None = None, t0: float | None = None) -> float:
        """Until every watcher reads every target ``want``; the seconds it took. With
        ``per_watcher``, when each watcher first read all its targets so is recorded."""
        t0 = time.monotonic() if t0 is None else t0
        deadline = t0 + timeout
        pending = list(watchers)
        while pending:
            for w in list(pending):
                if not self.missing_links([w], targets, want):
                    pending.remove(w)
                    if per_watcher is not None:
                        per_watcher[w] = time.monotonic() - t0
            if not pending:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"not {want} within {timeout:.0f} s: "
                                   f"{self.missing_links(pending, targets, want)[:10]}")
            time.sleep(0.5)
        return time.monotonic() - t0


# -- the phases ---------------------------------------------------------------------------


def pair_mesh(mesh: Mesh) -> dict[str, Any]:
    t0 = time.monotonic()
    pairs = [(a, b) for i, a in enumerate(mesh.names) for b in mesh.names[i + 1:]]
    for a, b in pairs:
        procs.pair(mesh.nodes[a], mesh.nodes[b])
    paired = time.monotonic() - t0
    mesh.progress(f"{len(pairs)} pairings in {paired:.0f} s; waiting for every node to read every other")
    converged = mesh.wait_links(mesh.names, mesh.names, "connected", timeout=paired + max(120, 4 * mesh.poll_s),
                                t0=t0)
    return {"pairings": len(pairs), "pairCallsS": round(paired, 1), "meshConnectedS": round(converged, 1)}


def idle(mesh: Mesh, window_s: float) -> dict[str, Any]:
    """CPU and memory of every node over ``window_s`` with nothing sent to them."""
    pids = {name: mesh.nodes[name].proc.pid for name in mesh.names}
    before = {name: procs.cpu_sample(pid) for name, pid in pids.items()}
    time.sleep(window_s)
    after = {name: procs.cpu_sample(pid) for name, pid in pids.items()}
    cpu = {name: procs.cpu_used(before[name], after[name]) / window_s * 100 for name in mesh.names}
    rss = {name: procs.rss_mb(pid) or 0.0 for name, pid in pids.items()}
    return {"idleWindowS": window_s,
            "idleCpuPctPerNode": {"mean": round(statistics.fmean(cpu.values()), 2),
                                  "max": round(max(cpu.values()), 2), "min": round(min(cpu.values()), 2)},
            "rssMbPerNode": {"mean": round(statistics.fmean(rss.values()), 1), "max": round(max(rss.values()), 1)},
            "idleCpuPct": {k: round(v, 2) for k, v in cpu.items()}}


def _chat(client: httpx.Client, url: str, model: str, stream: bool, tag: str) -> httpx.Response:
    body = {"model": model, "stream": stream, "messages": [{"role": "user", "content": f"{tag}. Answer briefly."}]}
    return client.post(url + "/v1/chat/completions", json=body)


def placement_cpu(mesh: Mesh, requests: int) -> dict[str, Any]:
    """The entry node's CPU per request with N candidates against 2, interleaved so both see
    the same box; its idle rate (measured just before) taken off."""
    entry = mesh.nodes[mesh.names[0]]
    pid = entry.proc.pid
    base0 = procs.cpu_sample(pid)
    time.sleep(2.0)
    idle_rate = procs.cpu_used(base0, procs.cpu_sample(pid)) / 2.0
    used = {COMMON: 0.0, DUO: 0.0}
    wall = {COMMON: 0.0, DUO: 0.0}
    served: dict[str, dict[str, int]] = {COMMON: {}, DUO: {}}
    with httpx.Client(timeout=30, trust_env=False) as c:
        for m in (COMMON, DUO):  # a warm-up each: first-use costs are not placement
            _chat(c, entry.url, m, False, "warm-up")
        for i in range(requests):
            for m in ((COMMON, DUO) if i % 2 == 0 else (DUO, COMMON)):
                before, t = procs.cpu_sample(pid), time.monotonic()
                r = _chat(c, entry.url, m, False, f"placement {i}")
                after, dt = procs.cpu_sample(pid), time.monotonic() - t
                if r.status_code != 200:
                    raise RuntimeError(f"placement request for {m} answered {r.status_code}: {r.text[:200]}")
                used[m] += procs.cpu_used(before, after) - idle_rate * dt
                wall[m] += dt
                by = r.headers.get("x-hub-pool-served-by", "?")
                served[m][by] = served[m].get(by, 0) + 1
    per = {m: used[m] / requests * 1000 for m in used}
    return {"placementRequests": requests,
            "cpuMsPerRequest": {f"{mesh.n}Candidates": round(per[COMMON], 2), "2Candidates": round(per[DUO], 2)},
            "extraCpuMsAtNCandidates": round(per[COMMON] - per[DUO], 2),
            "wallMsPerRequest": {f"{mesh.n}Candidates": round(wall[COMMON] / requests * 1000, 1),
                                 "2Candidates": round(wall[DUO] / requests * 1000, 1)},
            "servedBy": served}


def death_and_back(mesh: Mesh) -> dict[str, Any]:
    victim = mesh.names[-1]
    others = mesh.names[:-1]
    node = mesh.nodes[victim]
    mesh.progress(f"killing {victim}; waiting for the other {len(others)} to read it unreachable")
    t0 = time.monotonic()
    node.proc.kill()
    node.proc.wait(10)
    down: dict[str, float] = {}
    bound = (UNREACHABLE_POLLS + 2) * mesh.poll_s + 60
    detect = mesh.wait_links(others, [victim], "unreachable", timeout=bound, per_watcher=down, t0=t0)
    mesh.progress(f"restarting {victim}")
    t1 = time.monotonic()
    proc = mesh.launch(victim)
    mesh.wait_up(victim, proc)
    booted = time.monotonic() - t1
    up: dict[str, float] = {}
    back = mesh.wait_links(others, [victim], "connected", timeout=2 * mesh.poll_s + 120, per_watcher=up, t0=t1)
    # and it reads the others connected again
    mesh.wait_links([victim], others, "connected", timeout=2 * mesh.poll_s + 120)
    return {"deathToAllUnreachableS": round(detect, 1),
            "deathToUnreachableS": {"median": round(statistics.median(down.values()), 1),
                                    "max": round(max(down.values()), 1)},
            "boundS": UNREACHABLE_POLLS * mesh.poll_s + mesh.poll_s,
            "restartBootS": round(booted, 1), "restartToAllConnectedS": round(back, 1),
            "restartToConnectedS": {"median": round(statistics.median(up.values()), 1),
                                    "max": round(max(up.values()), 1)}}


def mixed_load(mesh: Mesh, per_node: int) -> tuple[dict[str, Any], list[str]]:
    """``per_node`` requests entering every node; the history reconciled with every log."""
    ops: list[Op] = []
    for i, name in enumerate(mesh.names):
        for k in range(per_node):
            kind = k % 4
            held = min(mesh.n, len(FAMILY))  # the family members some node holds
            model = (COMMON, FAMILY[(i + 1 + k) % held], unique_model((i + 1 + k) % mesh.n), DUO)[kind]
            ops.append(Op(entry=name, model=model, stream=k % 2 == 1))
    lock = threading.Lock()
    t0 = time.monotonic()

    def run(op: Op) -> None:
        url = mesh.nodes[op.entry].url
        with httpx.Client(timeout=60, trust_env=False) as c:
            body = {"model": op.model, "stream": op.stream,
                    "messages": [{"role": "user", "content": f"mixed {op.entry} {op.model}. Answer briefly."}]}
            try:
                with c.stream("POST", url + "/v1/chat/completions", json=body) as r:
                    op.status, op.rid = r.status_code, r.headers.get("x-hub-pool-request-id")
                    op.served_by = r.headers.get("x-hub-pool-served-by")
                    text = r.read().decode(errors="replace")
                if r.status_code == 200:
                    op.whole = "[DONE]" in text if op.stream else '"choices"' in text
            except httpx.HTTPError as exc:
                with lock:
                    op.error = type(exc).__name__

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(run, ops))
    took = time.monotonic() - t0
    logs = {name: _settled_log(mesh.nodes[name]) for name in mesh.names}
    problems = reconcile(ops, logs, mesh.names)
    forwarded = sum(1 for op in ops if op.served_by not in (None, "local"))
    return ({"mixedRequests": len(ops), "mixedOk": sum(1 for op in ops if op.status == 200 and op.whole),
             "mixedForwarded": forwarded, "mixedWallS": round(took, 1),
             "reconciledRows": sum(len(rows) for rows in logs.values())}, problems)


def _settled_log(node: procs.BenchNode, timeout: float = 15.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        rows = node.op("GET", "/routing-log?limit=10000")["entries"]
        if not any(r["outcome"] == "pending" for r in rows) or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def reconcile(ops: list[Op], logs: dict[str, list[dict[str, Any]]], names: list[str]) -> list[str]:
    """Every disagreement between the client's history and the routing logs (never stops at
    the first). Rows the client did not send (the warm-ups and placement requests, which
    entered the first node before this load) are told apart by id: each of those has its own."""
    problems: list[str] = []
    by_fqdn = {procs.fqdn(n): n for n in names}
    outbound: dict[str, dict[str, dict]] = {n: {} for n in names}
    inbound: dict[str, dict[str, dict]] = {n: {} for n in names}
    for node, rows in logs.items():
        for row in rows:
            table = outbound if row["direction"] == "outbound" else inbound
            if row["id"] in table[node]:
                problems.append(f"{node}: request id {row['id']} has two {row['direction']} rows")
            table[node][row["id"]] = row
            if row["outcome"] == "pending":
                problems.append(f"{node}: row {row['id']} still pending")
    rids = set()
    for op in ops:
        what = f"{op.entry} {op.model} stream={op.stream} rid={op.rid}"
        if op.status != 200 or not op.whole:
            problems.append(f"client: {what} answered {op.status} (whole={op.whole}, error={op.error})")
        if op.rid is None:
            continue
        if op.rid in rids:
            problems.append(f"client: two requests got id {op.rid}")
        rids.add(op.rid)
        sent = outbound[op.entry].get(op.rid)
        if sent is None:
            problems.append(f"{op.entry}: no outbound row for {what}")
            continue
        told = op.served_by or "?"
        if (sent["outcome"], sent["status"]) != ("served", 200) or sent["node"] != told:
            problems.append(f"{op.entry}: row says {sent['outcome']} {sent['status']} at {sent['node']}, "
                            f"client was told {told}: {what}")
        if told not in ("local", "?"):
            server = by_fqdn.get(told)
            got = inbound.get(server or "", {}).get(op.rid)
            if got is None or got["outcome"] != "served" or by_fqdn.get(got["node"]) != op.entry:
                problems.append(f"{server}: no served inbound row from {op.entry} for {what}: {got}")
    for node, received in inbound.items():
        for rid, got_row in received.items():
            sender = by_fqdn.get(got_row["node"])
            if sender is None or rid not in outbound.get(sender, {}):
                problems.append(f"{node}: inbound row {rid} whose sender {got_row['node']} has no outbound row")
    sent_by_client = {op.rid for op in ops}
    for node in names[1:]:  # the first node also took the placement phase's requests
        for rid in outbound[node]:
            if rid not in sent_by_client:
                problems.append(f"{node}: outbound row {rid} that no client sent")
    return problems


def run_mesh(nodes: int = 20, poll_s: int = DEFAULT_POLL_S, idle_s: float | None = None,
             placement_requests: int = 100, per_node: int = 8, kill: bool = True,
             progress: Callable[[str], None] = lambda m: None, workdir: Path | None = None) -> MeshReport:
    """The whole run; RuntimeError when the mesh cannot be built."""
    if nodes < 3:
        raise ValueError("--nodes must be 3 or more (the placement figure compares N candidates with 2)")
    if importlib.util.find_spec("hubpool_sim") is None:
        raise RuntimeError("hubpool bench mesh needs the engine simulator, hubpool-sim (a dev dependency): run it "
                           "from a clone with `uv run hubpool bench mesh`, or pip install the hubpool-sim wheel")
    report = MeshReport(nodes, poll_s)
    idle_s = float(idle_s if idle_s is not None else 2 * poll_s)
    with tempfile.TemporaryDirectory(prefix="hubpool-mesh-") as tmp:
        mesh = Mesh(Path(workdir or tmp), nodes, poll_s, progress)
        try:
            progress(f"starting {nodes} simulated engines")
            mesh.start_engines()
            t0 = time.monotonic()
            mesh.start_nodes()
            report.figures["startS"] = round(time.monotonic() - t0, 1)
            progress("pairing the mesh")
            report.figures.update(pair_mesh(mesh))
            # let start-up and pairing work (first probes, key upgrades) finish before idling
            time.sleep(min(poll_s, 10))
            progress(f"idle for {idle_s:.0f} s")
            report.figures.update(idle(mesh, idle_s))
            if placement_requests:
                progress(f"placement: {placement_requests} requests each at {nodes} and 2 candidates")
                report.figures.update(placement_cpu(mesh, placement_requests))
            if per_node:
                progress(f"mixed load: {per_node} requests into each node")
                figures, problems = mixed_load(mesh, per_node)
                report.figures.update(figures)
                report.problems += problems
            if kill:
                report.figures.update(death_and_back(mesh))
        finally:
            mesh.close()
    return report


def text_lines(report: MeshReport) -> list[str]:
    f = report.figures
    lines = [f"mesh of {report.nodes} nodes, health poll every {report.poll_s} s"]
    if "meshConnectedS" in f:
        lines.append(f"pairing: {f['pairings']} pairings in {f['pairCallsS']} s; every node reads every other "
                     f"connected after {f['meshConnectedS']} s")
    if "idleCpuPctPerNode" in f:
        c, m = f["idleCpuPctPerNode"], f["rssMbPerNode"]
        lines.append(f"idle over {f['idleWindowS']:.0f} s: CPU per node mean {c['mean']} % of a core "
                     f"(max {c['max']} %); RSS mean {m['mean']} MB (max {m['max']} MB)")
    if "cpuMsPerRequest" in f:
        per = f["cpuMsPerRequest"]
        lines.append(f"entry node CPU per request: {per[f'{report.nodes}Candidates']} ms at {report.nodes} "
                     f"candidates, {per['2Candidates']} ms at 2 (extra {f['extraCpuMsAtNCandidates']} ms)")
    if "mixedRequests" in f:
        lines.append(f"mixed load: {f['mixedOk']}/{f['mixedRequests']} whole answers, {f['mixedForwarded']} "
                     f"forwarded; {f['reconciledRows']} routing-log rows reconciled")
    if "deathToAllUnreachableS" in f:
        lines.append(f"a node killed: every other node reads it unreachable after {f['deathToAllUnreachableS']} s "
                     f"(median {f['deathToUnreachableS']['median']} s); restarted, connected again everywhere "
                     f"after {f['restartToAllConnectedS']} s (its boot {f['restartBootS']} s)")
    lines += [f"PROBLEM: {p}" for p in report.problems[:20]]
    return lines
