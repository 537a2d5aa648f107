"""`hubpool bench pool`: placement against every other way to spread the work, on a pool of
simulated boxes of unequal speed, replaying the same seeded traces through each dispatcher.

What it starts, all on loopback, each its own process, all stopped at the end by their own
ids: per box, two simulated engines (``hubpool-sim``: one for the traces' chat model, whose
engine states its slots and reports prefill timings, and one for the cold trace's model,
whose engine reports residency), with the box's slots, prefill and decode rates, a prompt
cache and model load time, on a clock ``scale`` times real time; per hubpool variant, one
``hubpool serve`` node per box beside those engines, paired with one another as operators
pair them; nginx with round-robin, ``least_conn`` and ``least_conn`` weighted by slots when
installed; LiteLLM's router when importable; and the oracle (:mod:`pool_oracle`).

Each round replays every trace through every dispatcher, in an order that rotates and
alternates from round to round, every engine's caches flushed and only the warm node's
cold model resident before each run. Figures are in the simulated clock (measured time
divided by the scale), except what hubpool adds before the first token, measured in real
milliseconds against the engine itself.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from hubpool_core.bench import pool_routers, procs
from hubpool_core.bench.pool_traces import (
    BUILT_IN,
    POOLS,
    NodeSpec,
    Trace,
    TraceRequest,
    built_in,
    spec_json,
)

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
CHAT_MODEL = "bench-chat"
COLD_MODEL = "bench-cold"
MODELS = {"chat": CHAT_MODEL, "cold": COLD_MODEL}
#: the spec's poll cadence (30 s) and affinity TTL (10 min), scaled with the clock
POLL_S = 30
LOAD_POLL_MS = 500
AFFINITY_TTL_MS = 600_000

#: hubpool nodes started at once (each start is seconds of CPU; 2 cores)
START_WAVE = 3
#: hubpool as docs/placement.md says to run it on boxes of unequal speed
DOCUMENTED = {"poolSlotAwareness": 1, "poolPrefixAffinityMaxInFlight": 2, "poolProbeSnapshotTtlMs": 10_000}
#: the documented settings with the pool-wide admission queue on, told the first-token objective
#: the bench scores goodput by (chat, burst and cold's 5 s SLO): an operator with an objective
#: states it (docs/placement.md, "The admission queue")
QUEUED = {**DOCUMENTED, "poolAdmissionQueue": 64, "poolAdmissionTargetMs": 5000}
#: hubpool-spec is untouched hubpool with the spec's queue-depth ranking (poolTtftRanking 0):
#: hubpool as it placed before predicted time to first token
HUBPOOL_VARIANTS = ("hubpool-default", "hubpool-documented", "hubpool-spec", "hubpool-base", "hubpool-queue")
NGINX_POLICIES = {"nginx-rr": "", "nginx-least-conn": "least_conn;", "nginx-weighted": "least_conn;"}
LITELLM_STRATEGIES = {"litellm-least-busy": "least-busy", "litellm-latency": "latency-based-routing"}
#: every dispatcher but the routers (SGLang's and vLLM's: :func:`pool_routers.router_names`)
ALL_DISPATCHERS = (*HUBPOOL_VARIANTS, *NGINX_POLICIES, *LITELLM_STRATEGIES, "oracle")


def every_dispatcher() -> tuple[str, ...]:
    """Every dispatcher the bench knows, the routers included (asked of the simulator)."""
    return (*ALL_DISPATCHERS[:-1], *pool_routers.router_names(), "oracle")


@dataclass
class Dispatcher:
    """A way to spread the work: per model, the URL(s) a request is sent to (one per entry
    node for hubpool, one front door otherwise), and the processes it costs."""

    name: str
    urls: dict[str, list[str]]
    pids: list[int] = field(default_factory=list)


@dataclass
class RunResult:
    trace: str
    dispatcher: str
    round: int
    requests: list[dict[str, Any]]
    span_s: float
    cached_tokens: int
    prompt_tokens: int
    sim_load: dict[str, int]


# -- statistics -----------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (nearest rank) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[rank]


def bootstrap(values: list[float], q: float, resamples: int = 400, seed: int = 7) -> tuple[float, float] | None:
    """A 95 % bootstrap interval of the q-th percentile (resampling requests)."""
    if len(values) < 2:
        return None
    rng = random.Random(seed)
    estimates = sorted(percentile([rng.choice(values) for _ in values], q) or 0.0 for _ in range(resamples))
    return estimates[int(0.025 * resamples)], estimates[min(resamples - 1, int(0.975 * resamples))]


def summarise(runs: list[RunResult], slo_ms: float) -> dict[str, Any]:
    """One dispatcher on one trace, every round pooled."""
    rows = [r for run in runs for r in run.requests]
    ok = [r for r in rows if r["status"] == 200 and r.get("ttftMs") is not None and not r.get("error")]
    ttft = [r["ttftMs"] for r in ok]
    e2e = [r["e2eMs"] for r in ok if r.get("e2eMs") is not None]
    span = sum(max(run.span_s, 1e-9) for run in runs)
    within = sum(1 for t in ttft if t <= slo_ms)
    prompt = sum(run.prompt_tokens for run in runs)
    out: dict[str, Any] = {"requests": len(rows), "served": len(ok), "failed": len(rows) - len(ok),
                           "rounds": len(runs), "sloMs": slo_ms}
    for q in (50, 95, 99):
        out[f"ttftP{q}"] = _round(percentile(ttft, q))
        interval = bootstrap(ttft, q)
        out[f"ttftP{q}Ci"] = [_round(interval[0]), _round(interval[1])] if interval else None
    out["e2eP95"] = _round(percentile(e2e, 95))
    out["goodputPerS"] = round(within / span, 4) if span else None
    out["withinSlo"] = within
    out["cacheShare"] = round(sum(run.cached_tokens for run in runs) / prompt, 4) if prompt else None
    out["p95ByRound"] = [_round(percentile([r["ttftMs"] for r in run.requests if r["status"] == 200
                                            and r.get("ttftMs") is not None], 95)) for run in runs]
    served: dict[str, int] = {}
    for r in ok:
        served[r.get("sim") or "?"] = served.get(r.get("sim") or "?", 0) + 1
    out["servedBy"] = served
    out["firstServedBy"] = [[r.get("sim") for r in sorted(run.requests, key=lambda x: x["sentAtS"])[:3]]
                            for run in runs]
    errors = sorted({(r.get("error") or f"HTTP {r['status']}")[:120] for r in rows if r not in ok})
    out["errors"] = errors[:5]
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


# -- the pool -------------------------------------------------------------------------

def engine_choice() -> tuple[str, str, str, str, list[str]]:
    """(slotted kind, its variable, resident kind, its variable, every engine variable).

    Chosen by what each engine can say, never by name: the chat model's engine states its
    slots and has no residency API (every model it lists is loaded); the cold model's
    engine reports residency. The simulator imitates each by the same kind."""
    from hubpool_core.plugins import load_plugins

    engines = load_plugins().engines
    if not engines:
        raise RuntimeError("no engine plugin is installed: hubpool nodes would have nothing to place on")
    slotted = [e for e in engines if e.states_slots and not e.has_residency] or [e for e in engines if e.states_slots]
    resident = [e for e in engines if e.has_residency and e.states_slots] or [e for e in engines if e.has_residency]
    if not slotted or not resident:
        raise RuntimeError("the bench needs an engine plugin that states slots and one that reports residency")
    return slotted[0].kind, slotted[0].env_var, resident[0].kind, resident[0].env_var, \
        sorted({e.env_var for e in engines})


def _sim_config(flavor: str, node: NodeSpec, model: str, scale: float, *, resident: bool, name: str,
                port: int) -> dict[str, Any]:
    return {"flavor": flavor, "port": port, "models": [{"id": model, "window": 131_072}], "slots": node.slots,
            "prefill_tps": node.prefill_tps, "decode_tps": node.decode_tps, "load_ms": node.load_ms,
            "timings": True, "prompt_cache": True, "time_scale": scale, "name": name,
            "preloaded": [model] if resident else [], "keep_alive_s": 1e9}


def start_sim(started: procs.Started, config: dict[str, Any], label: str) -> tuple[str, subprocess.Popen]:
    path = started.workdir / f"{label}.json"
    path.write_text(json.dumps(config))
    proc = started.start(label, [sys.executable, "-m", "hubpool_sim.cli", "--config", str(path)],
                         env=procs.child_env({}))
    url = f"http://127.0.0.1:{config['port']}"
    procs.wait_http(url + "/_sim/stats", proc, 30, f"simulated engine {label}", "\n" + started.log_tail(label))
    return url, proc


NGINX_HEAD = procs.NGINX_HEAD + "    client_max_body_size 64m;\n"
NGINX_SERVER = """    upstream {name} {{
        {policy}
{servers}        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=1024;
        location / {{
            proxy_pass http://{name};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 3600s;
        }}
    }}
"""


def nginx_conf(run: Path, groups: dict[str, dict[str, tuple[str, list[tuple[str, int]]]]]) -> str:
    """One nginx serving every (policy, model) pair on its own port: ``groups`` is
    policy name -> model -> (listen port as text, [(upstream host:port, weight)])."""
    parts = [NGINX_HEAD.format(run=run)]
    for policy, models in groups.items():
        for model, (port, servers) in models.items():
            weighted = policy == "nginx-weighted"
            lines = "".join(f"        server {hp}{f' weight={w}' if weighted else ''};\n" for hp, w in servers)
            parts.append(NGINX_SERVER.format(name=f"{policy.replace('-', '_')}_{model}",
                                             policy=NGINX_POLICIES[policy], servers=lines, port=port))
    parts.append("}\n")
    return "".join(parts)


class Pool:
    """Everything one bench run started, and how to reach it."""

    def __init__(self, started: procs.Started, nodes: tuple[NodeSpec, ...], scale: float,
                 wanted: tuple[str, ...], progress: Callable[[str], None], warm_node: int = 1):
        self.started, self.nodes, self.scale, self.progress = started, nodes, scale, progress
        self.sims: dict[str, list[str]] = {"chat": [], "cold": []}
        self.dispatchers: dict[str, Dispatcher] = {}
        self.notes: dict[str, str] = {}
        slotted, slotted_var, resident, resident_var, all_vars = engine_choice()
        progress("starting the simulated engines")
        for i, node in enumerate(nodes):
            for model, flavor in (("chat", slotted), ("cold", resident)):
                config = _sim_config(flavor, node, MODELS[model], scale, resident=model == "chat" or i == warm_node,
                                     name=node.name, port=procs.free_port())
                url, _ = start_sim(started, config, f"sim-{model}-{node.name}")
                self.sims[model].append(url)
        variants = [v for v in HUBPOOL_VARIANTS if v in wanted]
        if variants:
            self._start_hubpool(variants, slotted_var, resident_var, all_vars)
        front = [n for n in wanted if n in NGINX_POLICIES]
        if front:
            binary = procs.nginx_path()
            if binary:
                self._start_nginx(binary, front)
            else:
                for name in front:
                    self.notes[name] = "nginx is not installed (apt-get install nginx): skipped"
        lite = [n for n in wanted if n in LITELLM_STRATEGIES]
        if lite:
            import importlib.util

            if importlib.util.find_spec("litellm") is None:
                for name in lite:
                    self.notes[name] = "litellm is not importable (uv run --with litellm hubpool bench pool): skipped"
            else:
                for name in lite:
                    self._start_litellm(name)
        known = pool_routers.routers()
        for name in (n for n in wanted if n in known):
            self._start_router(name, known[name])
        if "oracle" in wanted:
            port = procs.free_port()
            argv = [sys.executable, "-m", "hubpool_core.bench.pool_oracle", "--port", str(port)]
            for url in self.sims["chat"] + self.sims["cold"]:
                argv += ["--upstream", url]
            proc = started.start("oracle", argv, env=procs.child_env({}))
            url = f"http://127.0.0.1:{port}"
            procs.wait_http(url + "/v1/models", proc, 30, "the oracle", "\n" + started.log_tail("oracle"))
            self.dispatchers["oracle"] = Dispatcher("oracle", {"chat": [url], "cold": [url]}, [proc.pid])

    def _start_hubpool(self, variants: list[str], slotted_var: str, resident_var: str, all_vars: list[str]) -> None:
        """Every variant's nodes, started together; then each variant's nodes paired with one
        another, the variants side by side."""
        from concurrent.futures import ThreadPoolExecutor

        self.progress(f"starting {', '.join(variants)}: one node per box each")
        prefix = {"hubpool-default": "d", "hubpool-documented": "doc", "hubpool-spec": "s", "hubpool-base": "b",
                  "hubpool-queue": "q"}
        env = {"HUB_POOL_DEV_HEALTH_POLL_SECONDS": str(max(1, round(POLL_S * self.scale))),
               # the busy load poll (poolLoadPollMs' 500 ms) on the same compressed clock
               "HUB_POOL_DEV_LOAD_POLL_MS": str(max(50, round(LOAD_POLL_MS * self.scale))),
               "HUB_POOL_PREFIX_AFFINITY_TTL_MS": str(max(1000, int(AFFINITY_TTL_MS * self.scale))),
               # the engines report durations on their own clock: the admission queue's waits too
               "HUB_POOL_DEV_CLOCK_SPEEDUP": str(max(1, round(1 / self.scale)))}
        specs: dict[str, dict[str, str]] = {}
        settings: dict[str, dict[str, Any]] = {}
        members: dict[str, list[str]] = {}
        for variant in variants:
            extra = {"HUB_POOL_PLUGINS_DISABLED": "stages", "HUB_POOL_THROUGHPUT_PLACEMENT": "off",
                     "HUB_POOL_CONTENTION_PLACEMENT": "off"} if variant == "hubpool-base" else {}
            for i, node in enumerate(self.nodes):
                name = f"{prefix[variant]}-{node.name}"
                members.setdefault(variant, []).append(name)
                specs[name] = {**env, **extra, slotted_var: self.sims["chat"][i], resident_var: self.sims["cold"][i]}
                stated = {"ollamaSlots": node.slots}
                settings[name] = {"hubpool-documented": {**DOCUMENTED, **stated}, "hubpool-queue": {**QUEUED, **stated},
                                  "hubpool-spec": {"poolTtftRanking": 0}}.get(variant, {})
        nodes: dict[str, procs.BenchNode] = {}
        names = list(specs)
        # a node's start is ~4 s of CPU: not all at once, and a variant's nodes in one wave (each
        # wave's nodes know one another's addresses)
        step = max(1, START_WAVE // len(self.nodes)) * len(self.nodes)
        for at in range(0, len(names), step):
            wave = names[at:at + step]
            nodes.update(procs.start_nodes(self.started, {n: specs[n] for n in wave}, all_vars,
                                           routing_log_size=2000, node_settings=settings, start_timeout=180))
        self.progress("pairing each variant's nodes")

        def mesh(names: list[str]) -> None:
            for i, a in enumerate(names):
                for b in names[i + 1:]:
                    procs.pair(nodes[a], nodes[b])
            for a in names:
                for b in names:
                    if a != b:
                        procs.wait_offered(nodes[a], nodes[b], CHAT_MODEL, 90)

        with ThreadPoolExecutor(max_workers=len(variants)) as pool:
            list(pool.map(mesh, members.values()))
        for variant, names in members.items():
            urls = [nodes[n].url for n in names]
            self.dispatchers[variant] = Dispatcher(variant, {"chat": urls, "cold": urls},
                                                   [nodes[n].proc.pid for n in names])

    def _start_nginx(self, binary: str, policies: list[str]) -> None:
        self.progress("starting nginx")
        run = self.started.workdir / "nginx"
        run.mkdir(exist_ok=True)
        groups: dict[str, dict[str, tuple[str, list[tuple[str, int]]]]] = {}
        for policy in policies:
            groups[policy] = {model: (str(procs.free_port()),
                                      [(url.split("//", 1)[1], node.slots) for url, node in zip(urls, self.nodes,
                                                                                                 strict=True)])
                              for model, urls in self.sims.items()}
        conf = run / "nginx.conf"
        conf.write_text(nginx_conf(run, groups))
        proc = self.started.start("nginx", [binary, "-p", str(run), "-c", str(conf), "-e", "stderr"])
        for policy, models in groups.items():
            urls = {model: [f"http://127.0.0.1:{port}"] for model, (port, _) in models.items()}
            procs.wait_http(urls["chat"][0] + "/_sim/stats", proc, 20, "nginx", "\n" + self.started.log_tail("nginx"))
            self.dispatchers[policy] = Dispatcher(policy, urls, [proc.pid])

    def _start_litellm(self, name: str) -> None:
        self.progress(f"starting {name}")
        port = procs.free_port()
        argv = [sys.executable, "-m", "hubpool_core.bench.pool_litellm", "--port", str(port),
                "--strategy", LITELLM_STRATEGIES[name]]
        for model, urls in self.sims.items():
            for url in urls:
                argv += ["--route", f"{MODELS[model]}={url}"]
        proc = self.started.start(name, argv, env=procs.child_env({"LITELLM_LOG": "ERROR",
                                                                    "LITELLM_LOCAL_MODEL_COST_MAP": "True"}))
        url = f"http://127.0.0.1:{port}"
        procs.wait_http(url + "/v1/models", proc, 120, name, "\n" + self.started.log_tail(name))
        self.dispatchers[name] = Dispatcher(name, {"chat": [url], "cold": [url]}, [proc.pid])

    def _start_router(self, name: str, spec: dict[str, Any]) -> None:
        """SGLang's or vLLM's router, one process per model, when installed (:mod:`pool_routers`)."""
        if spec.get("missing"):
            self.notes[name] = str(spec["missing"])
            return
        self.progress(f"starting {name}")
        urls: dict[str, list[str]] = {}
        pids = []
        for model, workers in self.sims.items():
            if spec.get("needsHealth") and model == "cold":
                self.notes[name] = ("serves the chat model only: it registers a worker once it answers GET "
                                    "/health, and the cold trace's engines answer none")
                continue
            port = procs.free_port()
            label = f"{name}-{model}"
            proc = self.started.start(label, pool_routers.argv(name, port, procs.free_port(), workers),
                                      env=procs.child_env({"RUST_LOG": "warn"}))
            urls[model] = [f"http://127.0.0.1:{port}"]
            procs.wait_http(urls[model][0] + "/v1/models", proc, 60, name, "\n" + self.started.log_tail(label))
            pids.append(proc.pid)
        self.dispatchers[name] = Dispatcher(name, urls, pids)

    # -- between runs --------------------------------------------------------------------
    def all_sims(self) -> list[str]:
        return self.sims["chat"] + self.sims["cold"]

    def settle(self, timeout: float = 60.0) -> None:
        """Until no engine has work, then flush every cache (only the warm node's cold model
        stays resident)."""
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=10, trust_env=False) as c:
            while time.monotonic() < deadline:
                stats = [c.get(u + "/_sim/stats").json() for u in self.all_sims()]
                if all(s["in_flight"] == 0 and s["queued"] == 0 for s in stats):
                    break
                time.sleep(0.1)
            for u in self.all_sims():
                c.post(u + "/_sim/flush")

    def tokens(self) -> tuple[int, int]:
        """(cached, prompt) tokens every engine has served so far."""
        with httpx.Client(timeout=10, trust_env=False) as c:
            stats = [c.get(u + "/_sim/stats").json() for u in self.all_sims()]
        return sum(s["cached_tokens"] for s in stats), sum(s["prompt_tokens"] for s in stats)


class Replayer(procs.JsonLineProcess):
    """The replay process (:mod:`pool_replay`): one trace in, every request's figures out."""

    def __init__(self, started: procs.Started):
        super().__init__(started, "replay", "hubpool_core.bench.pool_replay")

    def run(self, job: dict[str, Any]) -> dict[str, Any]:
        result = self.ask(job)
        if "error" in result:
            raise RuntimeError(f"replay: {result['error']}")
        return result


def run_trace(pool: Pool, replayer: Replayer, dispatcher: Dispatcher, trace: Trace, rnd: int,
              tail_s: float) -> RunResult:
    pool.settle()
    if dispatcher.name.startswith("hubpool") and any(r.model == "cold" for r in trace.requests):
        # the flush unloaded what the last run loaded: hubpool's nodes read their engines'
        # residency each health poll and their peers' at the next, as they would see a real
        # engine unload a model, so the run starts once both polls have passed
        time.sleep(2 * max(1, round(POLL_S * pool.scale)) + 0.5)
    cached0, prompt0 = pool.tokens()
    deadline = (trace.span_s + tail_s) * pool.scale + 5
    result = replayer.run({"trace": trace.to_json(), "urls": dispatcher.urls, "models": MODELS,
                           "scale": pool.scale, "deadlineS": deadline})
    cached1, prompt1 = pool.tokens()
    load: dict[str, int] = {}
    for r in result["requests"]:
        load[r.get("sim") or "?"] = load.get(r.get("sim") or "?", 0) + 1
    return RunResult(trace.name, dispatcher.name, rnd, result["requests"], max(trace.span_s, 1.0),
                     cached1 - cached0, prompt1 - prompt0, load)


# -- what hubpool adds before the first token --------------------------------------------

def overhead(pool: Pool, replayer: Replayer, variant: str, n: int) -> dict[str, Any] | None:
    """Real milliseconds hubpool adds before the first token: short requests one at a time
    through each entry node (placed wherever its placement puts them: itself or a peer)
    and to the same engines directly, interleaved; each hubpool request is compared with the
    direct median of the engine that served it. nginx (least_conn) is measured beside."""
    hub = pool.dispatchers.get(variant)
    if hub is None:
        return None
    direct = Dispatcher("direct", {model: list(urls) for model, urls in pool.sims.items()})
    nginx = pool.dispatchers.get("nginx-least-conn")
    #: (entry node, engine that served, real ms to the first token) per request and dispatcher
    measured: dict[str, list[tuple[str, str, float]]] = {"direct": [], "hub": [], "nginx": []}
    for rnd in range(2):
        for entry in range(len(pool.nodes)):
            seq = Trace("overhead", [TraceRequest(0.0, 8, 1, entry=entry, session="seq", gap=0.0) for _ in range(n)])
            whos = [("direct", direct), ("hub", hub)] + ([("nginx", nginx)] if nginx is not None else [])
            for label, who in (reversed(whos) if rnd else whos):
                got = replayer.run({"trace": seq.to_json(), "urls": who.urls, "models": MODELS,
                                    "scale": pool.scale, "deadlineS": 60})["requests"]
                measured[label] += [(pool.nodes[entry].name, r.get("sim") or "?", r["realTtftMs"]) for r in got
                                    if r["status"] == 200 and r.get("realTtftMs") is not None]
    base: dict[str, list[float]] = {}
    for _, sim, ms in measured["direct"]:
        base.setdefault(sim, []).append(ms)
    medians = {sim: statistics.median(values) for sim, values in base.items()}

    def added(label: str) -> list[tuple[str, str, float]]:
        return [(name, sim, ms - medians[sim]) for name, sim, ms in measured[label] if sim in medians]

    hub_added, nginx_added = added("hub"), added("nginx")
    # entry node -> engine that served -> {requests, addedP50Ms}: a request placed on a peer
    # crossed two nodes, and the figure says how many did
    routes: dict[str, dict[str, list[float]]] = {}
    for name, sim, ms in hub_added:
        routes.setdefault(name, {}).setdefault(sim, []).append(ms)
    served = {name: {sim: {"requests": len(v), "addedP50Ms": _round2(percentile(v, 50))} for sim, v in by.items()}
              for name, by in routes.items()}
    return {"variant": variant, "addedP50Ms": _round2(percentile([x[2] for x in hub_added], 50)),
            "addedP95Ms": _round2(percentile([x[2] for x in hub_added], 95)),
            "hubpoolP50Ms": _round2(percentile([x[2] for x in measured["hub"]], 50)),
            "directP50Ms": _round2(percentile([x[2] for x in measured["direct"]], 50)),
            "nginxAddedP50Ms": _round2(percentile([x[2] for x in nginx_added], 50)), "requests": len(hub_added),
            "servedBy": served}


def _round2(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


# -- judging ----------------------------------------------------------------------------

def goal(gid: str, text: str, measured: str, verdict: str, note: str = "") -> dict[str, Any]:
    return {"goal": gid, "what": text, "measured": measured, "verdict": verdict, "note": note}


def _ratio(table: dict[str, dict[str, Any]], a: str, b: str, key: str = "ttftP95") -> float | None:
    x, y = (table.get(a) or {}).get(key), (table.get(b) or {}).get(key)
    if x is None or not y:
        return None
    return round(x / y, 3)


def judge(summary: dict[str, dict[str, dict[str, Any]]], pool_name: str, overheads: list[dict[str, Any]],
          cold_warm: str | None) -> list[dict[str, Any]]:
    """The issue's must-show targets, as measured in this run."""
    out = []

    def check(gid: str, text: str, trace: str, a: str, b: str, bound: float) -> None:
        r = _ratio(summary.get(trace, {}), a, b)
        out.append(goal(gid, text, "n/a" if r is None else f"{r:.2f}× ({a} p95 vs {b} p95)",
                        SKIP if r is None else (PASS if r <= bound else FAIL),
                        "" if r is not None else f"{trace}, {a} or {b} not in this run"))

    def best_of(trace: str, names: list[str]) -> str | None:
        by = summary.get(trace, {})
        ran = [n for n in names if (by.get(n) or {}).get("ttftP95")]
        return min(ran, key=lambda n: by[n]["ttftP95"]) if ran else None

    others = [n for n in {d for by in summary.values() for d in by} if not n.startswith("hubpool") and n != "oracle"]
    sglang_ca = list(pool_routers.SGLANG_CACHE_AWARE)
    if pool_name == "unequal":
        for trace in ("agents", "chat"):
            best = best_of(trace, others)
            check(f"unequal-{trace}", f"unequal boxes: untouched hubpool p95 TTFT ≤ 0.5× the best other dispatcher "
                                      f"on {trace}", trace, "hubpool-default", best or "(none ran)", 0.5)
    else:
        for trace in ("agents", "fleet"):
            best = best_of(trace, sglang_ca)
            check(f"equal-{trace}", f"equal boxes: untouched hubpool p95 TTFT ≤ 1.0× the better of SGLang's two "
                                    f"cache-aware configurations on {trace}", trace, "hubpool-default",
                  best or sglang_ca[0], 1.0)
        check("equal-chat", "equal boxes: untouched hubpool p95 TTFT ≤ 1.0× nginx least_conn on chat", "chat",
              "hubpool-default", "nginx-least-conn", 1.0)
    for trace in summary:
        check(f"oracle-{trace}", f"hubpool within 1.3× of the oracle on {trace}", trace, "hubpool-default",
              "oracle", 1.3)
    burst = summary.get("burst", {})
    q, rr = burst.get("hubpool-queue"), burst.get("nginx-rr")
    if q and rr and rr.get("goodputPerS"):
        ratio = q["goodputPerS"] / rr["goodputPerS"]
        out.append(goal("burst-queue", "burst, admission queue on: goodput ≥ 1.5× round-robin's, nothing lost",
                        f"{ratio:.2f}× ({q['goodputPerS']:.3f}/s vs {rr['goodputPerS']:.3f}/s), "
                        f"{q['failed']} failed", PASS if ratio >= 1.5 and q["failed"] == 0 else FAIL))
    else:
        out.append(goal("burst-queue", "burst, admission queue on: goodput ≥ 1.5× round-robin's, nothing lost",
                        "n/a", SKIP, "burst, hubpool-queue or nginx-rr not in this run"))
    cold = summary.get("cold", {}).get("hubpool-default")
    if cold and cold_warm:
        firsts = [f[0] for f in cold["firstServedBy"] if f]
        ok = bool(firsts) and all(f == cold_warm for f in firsts)
        out.append(goal("cold-warm-first", "cold trace: the first requests go to the warm node",
                        f"first request of each round served by {firsts} (warm: {cold_warm})", PASS if ok else FAIL))
    else:
        out.append(goal("cold-warm-first", "cold trace: the first requests go to the warm node", "n/a", SKIP,
                        "cold trace or hubpool-default not in this run"))
    for variant, bound, label in (("hubpool-default", 3.0, "untouched (the spec's poolProbeSnapshotTtlMs 0)"),
                                  ("hubpool-documented", 2.0, "as documented")):
        o = next((x for x in overheads if x and x.get("variant") == variant), None)
        what = f"what hubpool adds before the first token in a real pool, {label}: ≤ {bound:g} ms p50"
        gid = "overhead" if variant == "hubpool-default" else "overhead-documented"
        if o and o.get("addedP50Ms") is not None:
            out.append(goal(gid, what, f"+{o['addedP50Ms']:.2f} ms p50, +{o['addedP95Ms']:.2f} ms p95 (nginx "
                                       f"+{o['nginxAddedP50Ms']} ms)", PASS if o["addedP50Ms"] <= bound else FAIL))
        else:
            out.append(goal(gid, what, "n/a", SKIP, f"{variant} not measured in this run"))
    return out


# -- the run ----------------------------------------------------------------------------

@dataclass
class PoolReport:
    config: dict[str, Any]
    runs: list[RunResult] = field(default_factory=list)
    summary: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    goals: list[dict[str, Any]] = field(default_factory=list)
    #: the one the goal is judged on: hubpool as documented (its snapshot of the local engines'
    #: health), else the default
    overhead: dict[str, Any] | None = None
    overheads: list[dict[str, Any]] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)

    def to_json(self, with_requests: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"config": self.config, "summary": self.summary, "goals": self.goals,
                               "overhead": self.overhead, "overheads": self.overheads, "notes": self.notes}
        out["runs"] = [{"trace": r.trace, "dispatcher": r.dispatcher, "round": r.round, "spanS": r.span_s,
                        "cachedTokens": r.cached_tokens, "promptTokens": r.prompt_tokens, "servedBy": r.sim_load,
                        **({"requests": r.requests} if with_requests else {})} for r in self.runs]
        return out


def run_bench(*, traces: tuple[str, ...] = BUILT_IN, trace_files: tuple[Path, ...] = (),
              dispatchers: tuple[str, ...] = ALL_DISPATCHERS, pool_name: str = "unequal", rounds: int = 2,
              scale: float = 0.1, size: float = 1.0, seed: int = 1, overhead_n: int = 30, warmup: bool = True,
              progress: Callable[[str], None] = lambda _m: None, workdir: Path | None = None,
              nodes: tuple[NodeSpec, ...] | None = None) -> PoolReport:
    """Start the pool, replay every trace through every dispatcher in interleaved rounds,
    stop what was started, and judge the issue's targets. ``nodes`` replaces the named
    pool's boxes (the bench's own tests use two)."""
    import importlib.util

    if importlib.util.find_spec("hubpool_sim") is None:
        raise RuntimeError("hubpool bench pool needs the engine simulator, hubpool-sim (a dev dependency: "
                           "`uv sync` installs it)")
    nodes = nodes or POOLS[pool_name]
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="hubpool-bench-pool-")
        workdir = Path(tmp.name)
    started = procs.Started(workdir)
    report = PoolReport({"pool": pool_name, "nodes": spec_json(nodes), "scale": scale, "rounds": rounds,
                         "size": size, "seed": seed, "traces": list(traces) + [str(p) for p in trace_files],
                         "dispatchers": list(dispatchers), "cpus": os.cpu_count(),
                         "loadavgStart": os.getloadavg(), "documented": DOCUMENTED})
    t_start = time.monotonic()
    try:
        pool = Pool(started, nodes, scale, dispatchers, progress)
        report.notes.update(pool.notes)
        replayer = Replayer(started)
        order = [d for d in dispatchers if d in pool.dispatchers]
        if warmup:
            warm = built_in("chat", seed + 1000, nodes, size=min(size, 1.0) * 0.15)
            for name in order:
                progress(f"warm-up: {name}")
                run_trace(pool, replayer, pool.dispatchers[name], warm, -1, tail_s=120)
        from hubpool_core.bench.pool_traces import load as load_trace

        files = [load_trace(p) for p in trace_files]
        slo: dict[str, float] = {}
        for rnd in range(rounds):
            plan = [built_in(t, seed + rnd, nodes, size) for t in traces] + files
            for trace in plan:
                slo[trace.name] = trace.slo_ms
                shift = rnd % max(1, len(order))
                this = order[shift:] + order[:shift]
                if rnd % 2:
                    this.reverse()
                for name in this:
                    if any(r.model not in pool.dispatchers[name].urls for r in trace.requests):
                        continue  # a model it does not serve (the report's notes say why)
                    progress(f"round {rnd + 1}/{rounds}, {trace.name} ({len(trace.requests)} requests): {name}")
                    report.runs.append(run_trace(pool, replayer, pool.dispatchers[name], trace, rnd, tail_s=600))
        for trace_name in dict.fromkeys(r.trace for r in report.runs):
            report.summary[trace_name] = {}
            for name in order:
                runs = [r for r in report.runs if r.trace == trace_name and r.dispatcher == name]
                if runs:
                    report.summary[trace_name][name] = summarise(runs, slo.get(trace_name, 5000.0))
        if overhead_n:
            for variant in ("hubpool-default", "hubpool-documented"):
                if variant in pool.dispatchers:
                    progress(f"measuring what {variant} adds before the first token")
                    pool.settle()
                    report.overheads.append(overhead(pool, replayer, variant, overhead_n) or {})
            report.overhead = next((o for o in report.overheads if o.get("variant") == "hubpool-documented"),
                                   report.overheads[0] if report.overheads else None)
        warm_name = nodes[1].name if len(nodes) > 1 else nodes[0].name
        report.goals = judge(report.summary, pool_name, report.overheads, warm_name)
        report.config["loadavgEnd"] = os.getloadavg()
        report.config["wallS"] = round(time.monotonic() - t_start, 1)
        return report
    finally:
        started.stop_all()
        if tmp is not None:
            tmp.cleanup()


# -- output -----------------------------------------------------------------------------

COLUMNS = (("ttftP50", "TTFT p50"), ("ttftP95", "p95"), ("ttftP99", "p99"), ("e2eP95", "e2e p95"),
           ("goodputPerS", "goodput/s"), ("cacheShare", "cache"), ("failed", "failed"))


def table_rows(report: PoolReport) -> list[list[str]]:
    """The table: per trace and dispatcher, seconds of the simulated clock."""
    rows = []
    for trace, by in report.summary.items():
        base = by.get("nginx-weighted")
        oracle = by.get("oracle")
        for name, s in by.items():
            ci = s.get("ttftP95Ci")
            rows.append([trace, name,
                         _secs(s["ttftP50"]),
                         f"{_secs(s['ttftP95'])}" + (f" [{_secs(ci[0])}–{_secs(ci[1])}]" if ci else ""),
                         _secs(s["ttftP99"]), _secs(s["e2eP95"]),
                         "n/a" if s["goodputPerS"] is None else f"{s['goodputPerS']:.3f}",
                         "n/a" if s["cacheShare"] is None else f"{s['cacheShare']:.0%}",
                         f"{s['failed']}/{s['requests']}",
                         _times(s["ttftP95"], base["ttftP95"] if base else None),
                         _times(s["ttftP95"], oracle["ttftP95"] if oracle else None)])
    return rows


TABLE_HEAD = ["trace", "dispatcher", "TTFT p50 s", "p95 s [95% CI]", "p99 s", "e2e p95 s", "goodput/s", "cache",
              "failed", "p95 vs weighted", "p95 vs oracle"]


def _secs(ms: float | None) -> str:
    return "n/a" if ms is None else f"{ms / 1000:.2f}"


def _times(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or not b else f"{a / b:.2f}×"


def plot(report: PoolReport, path: Path) -> str:
    """A PNG of TTFT p50/p95/p99 per dispatcher per trace; what was written, or why not."""
    try:
        import matplotlib  # type: ignore[import-not-found]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found]
    except ImportError:
        return ("matplotlib is not installed, so no plot was drawn (uv run --with matplotlib hubpool bench pool "
                "--plot FILE)")
    traces = list(report.summary)
    if not traces:
        return "nothing was measured, so no plot was drawn"
    fig, axes = plt.subplots(1, len(traces), figsize=(5 * len(traces), 4.5), squeeze=False)
    for ax, trace in zip(axes[0], traces, strict=True):
        by = report.summary[trace]
        names = list(by)
        for offset, (key, label) in enumerate((("ttftP50", "p50"), ("ttftP95", "p95"), ("ttftP99", "p99"))):
            values = [(by[n][key] or 0) / 1000 for n in names]
            ax.bar([i + (offset - 1) * 0.27 for i in range(len(names))], values, width=0.27, label=label)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=60, ha="right", fontsize=8)
        ax.set_title(trace)
        ax.set_ylabel("time to first token, s (simulated clock)")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"plot written to {path}"
