"""``hubpool bench pool``'s strongest peers, run by the bench as it runs the simulator: as
processes, through ``python -m hubpool_sim.routers`` (so the core names no engine).

SGLang's model gateway (``sglang-router``, policies ``cache_aware`` with its defaults,
``cache_aware`` with its balance threshold sized for a home pool, and ``power_of_two``) and the
vLLM router (``vllm-router``, ``cache_aware``), each in front of the simulated engines, one
router process per model.

Both are PyPI wheels with a Rust core, and neither is a dependency: they run when installed
(``uv sync --group routers``, or ``uv run --group routers hubpool bench pool``), and the
report says how to install them when they are not. Each is started with its health checks
off where it has the switch (``--disable-health-check``; the vLLM router has none), a free
``--prometheus-port`` and warnings only. Both register a worker only once it answers
``GET /health``, which the cold trace's Ollama-shaped engines do not: the routers serve the
chat model's traces (chat, agents, fleet, burst), and the report says so.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

#: a home pool's boxes run two to four requests at once: SGLang's default absolute threshold
#: (64 requests of imbalance before it stops following the cache) never fires there, so the
#: tuned variant balances once one box is two requests busier than another
HOME_BALANCE_ABS = 2

INSTALL = "uv sync --group routers (or: uv run --group routers hubpool bench pool)"


@dataclass(frozen=True)
class RouterSpec:
    """One router dispatcher: which wheel runs it and how."""

    name: str
    module: str  # the importable package that says the wheel is installed
    script: str  # its console script
    policy: str
    extra: tuple[str, ...] = ()
    #: registers a worker only once it answers GET /health (both routers' start-up checks, whatever
    #: their health-check switches say): the Ollama-shaped engines of the cold trace answer none
    needs_health: bool = False

    def argv(self, port: int, prometheus_port: int, workers: list[str]) -> list[str]:
        binary = _script(self.script)
        head = [binary, "launch"] if self.script == "sglang-router" else [binary]
        # vLLM's router has no switch to turn its periodic checks off
        health = ["--disable-health-check"] if self.script == "sglang-router" else []
        return [*head, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers,
                "--policy", self.policy, *self.extra, *health, "--prometheus-host", "127.0.0.1",
                "--prometheus-port", str(prometheus_port), "--log-level",
                "warn" if self.script == "sglang-router" else "warning"]


ROUTERS = {
    "sglang-cache-aware": RouterSpec("sglang-cache-aware", "sglang_router", "sglang-router", "cache_aware",
                                     needs_health=True),
    "sglang-cache-aware-home": RouterSpec("sglang-cache-aware-home", "sglang_router", "sglang-router", "cache_aware",
                                          ("--balance-abs-threshold", str(HOME_BALANCE_ABS)), needs_health=True),
    "sglang-p2": RouterSpec("sglang-p2", "sglang_router", "sglang-router", "power_of_two", needs_health=True),
    "vllm-cache-aware": RouterSpec("vllm-cache-aware", "vllm_router", "vllm-router", "cache_aware",
                                   needs_health=True),
}


def _script(name: str) -> str:
    """The wheel's console script: beside this interpreter (a venv's bin), else on PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or name)


def missing(name: str) -> str | None:
    """Why the router dispatcher ``name`` cannot run here (with how to install it), or None."""
    spec = ROUTERS[name]
    if importlib.util.find_spec(spec.module) is None:
        return f"{spec.script} is not installed ({INSTALL}): skipped"
    if not (Path(sys.executable).parent / spec.script).exists() and shutil.which(spec.script) is None:
        return f"{spec.script}'s command is not on PATH though its package imports ({INSTALL}): skipped"
    return None


def listing() -> list[dict[str, object]]:
    """Every router dispatcher, whether it can run here and why not."""
    return [{"name": name, "missing": missing(name), "needsHealth": spec.needs_health}
            for name, spec in ROUTERS.items()]


def main(argv: list[str] | None = None) -> None:
    """``list``: the dispatchers as JSON; ``run NAME --port P --prometheus-port Q --worker URL...``:
    become that router (exec, so the bench's process id is the router's)."""
    parser = argparse.ArgumentParser(prog="python -m hubpool_sim.routers")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list")
    run = sub.add_parser("run")
    run.add_argument("name", choices=sorted(ROUTERS))
    run.add_argument("--port", type=int, required=True)
    run.add_argument("--prometheus-port", type=int, required=True)
    run.add_argument("--worker", action="append", required=True)
    args = parser.parse_args(argv)
    if args.command == "list":
        print(json.dumps(listing()))
        return
    command = ROUTERS[args.name].argv(args.port, args.prometheus_port, args.worker)
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
