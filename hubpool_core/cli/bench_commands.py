"""`hubpool bench`: what placing one request costs (`placement`), what the relay adds (`relay`), and how
many concurrent requests a model takes within a time-to-first-token SLO (`capacity`)."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import typer

from hubpool_core.cli.commands import JsonOption, app, out

bench_app = typer.Typer(help="Measure what hubpool adds (figures as ratios against a baseline from the same run).",
                        no_args_is_help=True)
app.add_typer(bench_app, name="bench")


def _pool(size: int, kinds: list[str]):  # noqa: ANN202 - synthetic peers, every knob's data present
    from hubpool_core.store import PoolPeer

    peers = []
    for i in range(size):
        caps = {"hardwareTier": ("high", "medium", "cpu-only")[i % 3], "acceptingWork": True,
                "inFlightRequests": i % 4, "gpuPressure": i % 4, "maxNumCtx": 8192 * (1 + i % 4),
                "maxPromptTokens": 4096 * (1 + i % 5), "ollamaSlots": 2 + i % 3,
                "backends": [{"type": kinds[i % len(kinds)], "healthy": True, "modelsLoaded": ["m:8b"]}]}
        peers.append(PoolPeer(id=f"p{i}", node_fqdn=f"node-{i}.example.ts.net", direction="outbound",
                              status="connected", enabled=True, last_capabilities=caps,
                              last_seen_at=datetime.now(UTC)))
    return peers


@bench_app.command("placement")
def placement(rounds: int = typer.Option(2000, "--rounds", min=10, max=1_000_000, help="Placements per size."),
              as_json: bool = JsonOption) -> None:
    """Place one request over 5, 20 and 100 candidates: the base ranker alone, then every stage on."""
    from hubpool_core.config import EnvSettings, PoolSettings
    from hubpool_core.placement import Load, PlacementContext, build_candidates, run_stages
    from hubpool_core.plugins import load_plugins

    settings = PoolSettings(poolPrefixAffinityMaxInFlight=2, poolSlotAwareness=1, poolPressureWeight=1,
                            poolMaxPromptTokens=16000, maxNumCtx=16384, ollamaSlots=2)
    host = load_plugins()
    load = Load()
    from hubpool_core.placement.throughput import ThroughputStore

    node = SimpleNamespace(load=load, env=EnvSettings.from_environ({}), settings=SimpleNamespace(current=settings),
                           engine_by_kind={}, throughput=ThroughputStore())
    for cls in host.engines:
        from hubpool_core.engine import EngineConfig

        node.engine_by_kind[cls.kind] = cls(EngineConfig(cls.default_url))
    stages = [cls(node) for cls in host.stages]
    body = {"model": "m:8b", "messages": [{"role": "system", "content": "x" * 20_000},
                                          {"role": "user", "content": "hello"}], "options": {"num_ctx": 12_000}}
    results = []
    for size in (5, 20, 100):
        peers = _pool(size, sorted(node.engine_by_kind) or ["engine"])

        def base(peers: list[Any] = peers) -> list:  # this size's pool, bound now
            return build_candidates("m:8b", [], peers, load, local_affinity=1, pressure_weight=1, poll_seconds=30)

        def full() -> list:
            ranking = base()
            ctx = PlacementContext(route="/api/chat", route_class="chat", model="m:8b", body=body,
                                   estimated_tokens=5_000, settings=settings, num_ctx=12_000, judged=True)
            ordered, _ = run_stages(stages, ranking, ctx, [])
            for stage in stages:
                stage.placed(ctx, ordered[0])
            return ordered

        figures = {}
        for name, fn in (("base", base), ("stages", full)):
            fn()  # warm
            started = time.perf_counter()
            for _ in range(rounds):
                fn()
            figures[name] = (time.perf_counter() - started) / rounds * 1e6
        results.append({"candidates": size, "baseUs": round(figures["base"], 1),
                        "allStagesUs": round(figures["stages"], 1),
                        "ratio": round(figures["stages"] / figures["base"], 2)})
    if as_json:
        print(json.dumps({"stages": [s.name for s in stages], "results": results}, indent=2))
        return
    out.print(f"stages on: {', '.join(s.name for s in stages)}  ({rounds} placements per size)")
    out.print(f"{'CANDIDATES':>10}  {'BASE µs':>9}  {'ALL STAGES µs':>13}  {'RATIO':>6}")
    for r in results:
        out.print(f"{r['candidates']:>10}  {r['baseUs']:>9}  {r['allStagesUs']:>13}  {r['ratio']:>6}")




def _wide() -> Any:
    """The console for the result tables: a pipe or a CI log gets wide rows, not folded ones."""
    from rich.console import Console

    return out if out.is_terminal else Console(width=170)


def _goals_table(goals: list[dict]) -> None:
    from rich.markup import escape
    from rich.table import Table

    colour = {"PASS": "green", "FAIL": "red", "SKIP": "yellow"}
    table = Table(title="Goals (ratios and differences against direct, medians of interleaved rounds)")
    for col in ("GOAL", "WHAT", "MEASURED", "VERDICT"):
        table.add_column(col, overflow="fold")
    for g in goals:
        verdict = g["verdict"] + (f" ({g['note']})" if g["note"] else "")
        table.add_row(g["goal"], escape(g["what"]), escape(g["measured"]),
                      f"[{colour[g['verdict']]}]{escape(verdict)}[/]")
    _wide().print(table)


def _summary_table(rows: list[dict]) -> None:
    from rich.table import Table

    table = Table(title="Per target and scenario (medians over rounds; times in ms)")
    cols = ("scenario", "target", "rps", "ttfb_p50", "ttfb_p99", "total_p50", "total_p99", "cpuMsPerRequest",
            "failed")
    for col in cols:
        table.add_column(col.upper() if col != "cpuMsPerRequest" else "CPU ms/req", justify="right")
    for r in sorted(rows, key=lambda r: r["scenario"]):
        table.add_row(*("" if r[c] is None else str(r[c]) for c in cols))
    _wide().print(table)


@bench_app.command("relay")
def relay(quick: bool = typer.Option(False, "--quick", help="Short counts (about 1–2 minutes), for CI and a "
                                                            "first look."),
          gate: bool = typer.Option(False, "--gate", help="The CI gate: a short run asserting loose ratios; exit 1 "
                                                          "when one fails."),
          rounds: int | None = typer.Option(None, "--rounds", min=1, max=50,
                                               help="Interleaved rounds per scenario (default 3, full run 5)."),
          duration: float | None = typer.Option(None, "--duration", min=1, max=600,
                                                   help="Cap in seconds on any single run (default 20, full 60)."),
          pace_ms: float = typer.Option(20.0, "--pace-ms", min=1, max=1000, help="Paced streams: ms per token."),
          nginx: bool = typer.Option(True, "--nginx/--no-nginx", help="Compare with nginx when it is installed."),
          as_json: bool = JsonOption) -> None:
    """Stub engine, nginx and hubpool nodes (one hop, two hops) under the same load, every goal judged."""
    from hubpool_core.bench.relay import FAIL, run_bench

    quiet = as_json or not out.is_terminal
    try:
        if quiet:
            report = run_bench(quick=quick, gate=gate, rounds=rounds, duration=duration, pace_ms=pace_ms,
                               use_nginx=nginx, progress=lambda m: print(f"# {m}", file=sys.stderr, flush=True))
        else:
            with out.status("starting") as status:
                report = run_bench(quick=quick, gate=gate, rounds=rounds, duration=duration, pace_ms=pace_ms,
                                   use_nginx=nginx, progress=lambda m: status.update(m))
    except RuntimeError as exc:
        out.print(f"[red]bench relay could not run: {exc}[/]")
        raise typer.Exit(2) from None
    data = report.to_json()
    if as_json:
        print(json.dumps(data, indent=2))
    else:
        _summary_table(data["summary"])
        _goals_table(data["goals"])
        cfg = data["config"]
        out.print(f"{cfg['rounds']} rounds, {cfg['wallS']} s, load average {cfg['loadavgStart'][0]:.2f} → "
                  f"{cfg['loadavgEnd'][0]:.2f} on {cfg['cpus']} CPUs" + (f"; nginx {data['nginx']}" if "nginx" in data
                                                                         else ""))
    if gate and any(g["verdict"] == FAIL for g in data["goals"]):
        raise typer.Exit(1)


@bench_app.command("capacity")
def capacity(model: str = typer.Option(..., "--model", "-m", help="The model to load."),
             url: str | None = typer.Option(None, "--url",
                                               help="A node's base URL (through the pool), or an engine's "
                                                    "(the engine alone). Default: this machine's node."),
             route: str = typer.Option("/v1/chat/completions", "--route",
                                       help="/v1/chat/completions, /v1/completions, /api/chat or /api/generate."),
             slo_ttft_ms: float = typer.Option(1000.0, "--slo-ttft-ms", min=1,
                                               help="The time-to-first-token SLO, in milliseconds."),
             pct: float = typer.Option(95.0, "--percentile", min=50, max=100,
                                       help="The percentile of time to first token held to the SLO."),
             max_concurrency: int = typer.Option(64, "--max-concurrency", min=1, max=4096,
                                                 help="The highest level tried (levels double up to it)."),
             levels: str | None = typer.Option(None, "--levels", help="Explicit levels, e.g. 1,2,3,4,6,8."),
             duration: float = typer.Option(10.0, "--duration", min=0.5, max=600,
                                            help="Seconds of load at each level."),
             prompt_tokens: int = typer.Option(256, "--prompt-tokens", min=1, max=200_000,
                                               help="Prompt size (about 4 bytes a token)."),
             max_tokens: int = typer.Option(64, "--max-tokens", min=1, max=100_000, help="Tokens asked for."),
             shared_prefix: bool = typer.Option(False, "--shared-prefix",
                                                help="Byte-identical prompts (a prefix cache's best case) instead "
                                                     "of unique ones."),
             api_key: str | None = typer.Option(None, "--api-key", envvar="HUB_POOL_BENCH_API_KEY",
                                                   help="An inference key, when the node wants one from here."),
             as_json: bool = JsonOption) -> None:
    """Raise concurrency until time to first token breaks the SLO; report the last level that met it."""
    import asyncio

    from rich.markup import escape

    from hubpool_core.bench.capacity import CapacityError, levels_up_to, run_capacity
    from hubpool_core.config import EnvSettings

    if route not in ("/v1/chat/completions", "/v1/completions", "/api/chat", "/api/generate"):
        out.print(f"[red]--route must be /v1/chat/completions, /v1/completions, /api/chat or /api/generate, "
                  f"not {escape(route)}[/]")
        raise typer.Exit(2)
    if levels:
        try:
            steps = sorted({int(x) for x in levels.split(",") if x.strip()})
        except ValueError:
            out.print(f"[red]--levels is a comma-separated list of whole numbers, not {escape(levels)}[/]")
            raise typer.Exit(2) from None
        if not steps or steps[0] < 1 or steps[-1] > max_concurrency:
            out.print(f"[red]--levels must lie between 1 and --max-concurrency ({max_concurrency})[/]")
            raise typer.Exit(2)
    else:
        steps = levels_up_to(max_concurrency)
    base = url or EnvSettings().base_url
    kwargs: dict[str, Any] = dict(route=route, slo_ttft_ms=slo_ttft_ms, pct=pct, levels=steps, duration_s=duration,
                                  prompt_tokens=prompt_tokens, max_tokens=max_tokens, shared_prefix=shared_prefix,
                                  api_key=api_key)
    if as_json or not out.is_terminal:
        def said(c: int, figures: dict | None) -> None:
            if figures is None:
                print(f"# {c} concurrent for {duration:g} s", file=sys.stderr, flush=True)

        try:
            report = asyncio.run(run_capacity(base, model, on_step=said, **kwargs))
        except CapacityError as exc:
            out.print(f"[red]bench capacity: {escape(str(exc))}[/]", soft_wrap=True)
            raise typer.Exit(1) from None
    else:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[done]} requests"),
                      TimeElapsedColumn(), console=out) as progress:
            task = progress.add_task("starting", total=len(steps), done=0)
            count = {"n": 0}

            def step(c: int, figures: dict | None) -> None:
                if figures is None:
                    progress.update(task, description=f"{c} concurrent ({duration:g} s)")
                else:
                    progress.advance(task)
                    verdict = "met" if figures["metSlo"] else "[red]broke[/]"
                    progress.console.print(f"  {c:>4} concurrent: TTFT p{pct:g} "
                                           f"{figures[f'ttftP{pct:g}Ms']} ms, {figures['failed']} failed — {verdict}")

            def tick() -> None:
                count["n"] += 1
                progress.update(task, done=count["n"])

            try:
                report = asyncio.run(run_capacity(base, model, on_step=step, tick=tick, **kwargs))
            except CapacityError as exc:
                progress.stop()
                out.print(f"[red]bench capacity: {escape(str(exc))}[/]", soft_wrap=True)
                raise typer.Exit(1) from None
    if as_json:
        print(json.dumps(report, indent=2))
        return
    from rich.table import Table

    key = f"ttftP{pct:g}Ms"
    table = Table(title=f"{model} at {base}{route}: TTFT p{pct:g} SLO {slo_ttft_ms:g} ms, {report['prompts']} prompts")
    for col in ("CONCURRENCY", "REQUESTS", "FAILED", "TTFT p50 ms", f"TTFT p{pct:g} ms", "TOTAL p50 ms", "REQ/S",
                "SLO"):
        table.add_column(col, justify="right")
    for s in report["steps"]:
        table.add_row(str(s["concurrency"]), str(s["requests"]), str(s["failed"]), str(s["ttftP50Ms"]), str(s[key]),
                      str(s["totalP50Ms"]), str(s["requestsPerS"]), "met" if s["metSlo"] else "[red]broke[/]")
    _wide().print(table)
    if report["brokeAt"] is None:
        out.print(f"capacity: at least {report['capacity']} concurrent (every level up to --max-concurrency met "
                  "the SLO)")
    elif report["capacity"] == 0:
        out.print(f"capacity: none — the SLO broke at {report['brokeAt']} concurrent")
    else:
        out.print(f"capacity: {report['capacity']} concurrent (the SLO broke at {report['brokeAt']})")
    failed = [e for s in report["steps"] for e in s["errors"]]
    if failed:
        out.print(f"first errors: {escape('; '.join(failed[:3]))}")


@bench_app.command("pool")
def pool(trace: list[str] = typer.Option(["chat", "agents", "fleet", "burst", "cold"], "--trace", "-t",
                                         help="A built-in trace (chat, agents, fleet, burst, cold) or a trace file "
                                              "(hubpool-trace/1 JSON Lines; docs/performance.md); repeatable."),
         dispatcher: list[str] = typer.Option([], "--dispatcher", "-d",
                                              help="Only these dispatchers (repeatable; default: every one)."),
         pool_name: str = typer.Option("unequal", "--pool", help="unequal (fast, mid, slow) or equal boxes."),
         rounds: int = typer.Option(2, "--rounds", min=1, max=20, help="Interleaved rounds (2 at least for p95)."),
         scale: float = typer.Option(0.1, "--scale", min=0.01, max=1.0,
                                     help="Real seconds per simulated second (0.1: ten times faster)."),
         size: float = typer.Option(1.0, "--size", min=0.02, max=4.0, help="Shorten (<1) or lengthen the traces."),
         seed: int = typer.Option(1, "--seed", help="The traces' seed (round r uses seed + r)."),
         quick: bool = typer.Option(False, "--quick", help="Half-size traces, one hubpool overhead pass."),
         overhead_n: int = typer.Option(30, "--overhead-requests", min=0, max=1000,
                                        help="Requests per entry node for what hubpool adds (0: skip)."),
         plot_path: str | None = typer.Option(None, "--plot", help="Write a PNG of TTFT percentiles here "
                                                                    "(needs matplotlib)."),
         save_traces: str | None = typer.Option(None, "--save-traces",
                                                help="Write the first round's built-in traces as files into this "
                                                     "directory, and stop."),
         as_json: bool = JsonOption) -> None:
    """Simulated boxes; hubpool, nginx, LiteLLM, SGLang's and vLLM's routers and an oracle on the same
    seeded traces."""
    from pathlib import Path

    from rich.markup import escape
    from rich.table import Table

    from hubpool_core.bench.pool import FAIL, TABLE_HEAD, every_dispatcher, plot, run_bench, table_rows
    from hubpool_core.bench.pool_traces import BUILT_IN, POOLS, TraceError, built_in

    if pool_name not in POOLS:
        out.print(f"[red]--pool is one of {', '.join(POOLS)}, not {escape(pool_name)}[/]")
        raise typer.Exit(2)
    known = every_dispatcher()
    unknown = [d for d in dispatcher if d not in known]
    if unknown:
        out.print(f"[red]unknown dispatcher(s) {escape(', '.join(unknown))}: choose from "
                  f"{', '.join(known)}[/]")
        raise typer.Exit(2)
    if quick:
        size = min(size, 0.5)
    names = tuple(t for t in trace if t in BUILT_IN)
    files = tuple(Path(t) for t in trace if t not in BUILT_IN)
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        out.print(f"[red]no such trace file (and not a built-in trace: {', '.join(BUILT_IN)}): "
                  f"{escape(', '.join(missing))}[/]")
        raise typer.Exit(2)
    if save_traces:
        target = Path(save_traces)
        target.mkdir(parents=True, exist_ok=True)
        for name in names:
            (target / f"{name}.jsonl").write_text(built_in(name, seed, POOLS[pool_name], size).dumps())
        out.print(f"wrote {', '.join(f'{n}.jsonl' for n in names)} to {escape(str(target))}")
        return
    quiet = as_json or not out.is_terminal
    kwargs: dict[str, Any] = dict(traces=names, trace_files=files, dispatchers=tuple(dispatcher) or known,
                                  pool_name=pool_name, rounds=rounds, scale=scale, size=size, seed=seed,
                                  overhead_n=overhead_n)
    try:
        if quiet:
            report = run_bench(progress=lambda m: print(f"# {m}", file=sys.stderr, flush=True), **kwargs)
        else:
            with out.status("starting") as status:
                report = run_bench(progress=lambda m: status.update(m), **kwargs)
    except TraceError as exc:
        out.print(f"[red]bench pool: {escape(str(exc))}[/]")
        raise typer.Exit(2) from None
    except RuntimeError as exc:
        out.print(f"[red]bench pool could not run: {escape(str(exc))}[/]")
        raise typer.Exit(2) from None
    said = plot(report, Path(plot_path)) if plot_path else None
    if as_json:
        data = report.to_json()
        if said:
            data["plot"] = said
        print(json.dumps(data, indent=2))
        return
    table = Table(title=f"TTFT per dispatcher ({pool_name} boxes; seconds of the simulated clock, "
                        f"{rounds} interleaved rounds pooled)")
    for col in TABLE_HEAD:
        table.add_column(col, justify="left" if col in ("trace", "dispatcher") else "right")
    for row in table_rows(report):
        table.add_row(*row)
    _wide().print(table)
    _goals_table(report.goals)
    for name, note in report.notes.items():
        out.print(f"{name}: {escape(note)}")
    for o in report.overheads:
        if o:
            out.print(f"what {o['variant']} adds before the first token (real ms, {o['requests']} requests): "
                      f"+{o['addedP50Ms']} p50, +{o['addedP95Ms']} p95; nginx +{o['nginxAddedP50Ms']} p50")
    cfg = report.config
    out.print(f"{cfg['wallS']} s, scale {cfg['scale']}, load average {cfg['loadavgStart'][0]:.2f} → "
              f"{cfg['loadavgEnd'][0]:.2f} on {cfg['cpus']} CPUs")
    if said:
        out.print(said)
    if any(g["verdict"] == FAIL for g in report.goals):
        out.print("[yellow]some targets were missed: see docs/performance.md for what each figure means[/]")


@bench_app.command("mesh")
def mesh(nodes: int = typer.Option(20, "--nodes", "-n", min=3, max=40, help="hubpool serve processes in the mesh."),
         poll_seconds: int = typer.Option(30, "--poll-seconds", min=1, max=300,
                                          help="Health poll interval (30: the default a node runs with)."),
         idle_seconds: float | None = typer.Option(None, "--idle-seconds", min=5, max=1800,
                                                   help="Idle window for CPU and memory (default: two polls)."),
         placement_requests: int = typer.Option(100, "--placement-requests", min=0, max=5000,
                                                help="Requests at N and at 2 candidates (0: skip)."),
         per_node: int = typer.Option(8, "--requests-per-node", min=0, max=500,
                                      help="Mixed-load requests entering each node (0: skip)."),
         no_kill: bool = typer.Option(False, "--no-kill", help="Skip the node-death and restart phase."),
         as_json: bool = JsonOption) -> None:
    """N nodes paired as a full mesh: pairing time, idle CPU and memory per node, placement CPU at N
    candidates against 2, detection of a dead node and its return, a reconciled mixed load."""
    from rich.markup import escape

    from hubpool_core.bench.mesh import run_mesh, text_lines

    started = time.monotonic()
    try:
        report = run_mesh(nodes=nodes, poll_s=poll_seconds, idle_s=idle_seconds, placement_requests=placement_requests,
                          per_node=per_node, kill=not no_kill,
                          progress=lambda m: print(f"# {m}", file=sys.stderr, flush=True))
    except (RuntimeError, ValueError) as exc:
        out.print(f"[red]bench mesh could not run: {escape(str(exc))}[/]")
        raise typer.Exit(2) from None
    report.figures["wallS"] = round(time.monotonic() - started, 1)
    report.figures["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        for line in text_lines(report):
            out.print(escape(line), soft_wrap=True)
    if report.problems:
        raise typer.Exit(1)
