"""`hubpool bench placement`: what placing one request costs, base ranker against every stage."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from types import SimpleNamespace
import typer

from hubpool_core.cli.main import JsonOption, app, out

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
                              last_seen_at=datetime.now(timezone.utc)))
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
    from hubpool_core.throughput import ThroughputStore

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

        def base() -> list:
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


