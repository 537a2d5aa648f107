"""``hubpool bench pool``'s router dispatchers: SGLang's model gateway and the vLLM router, Rust
routers shipped as wheels (the ``routers`` dependency group). What they are and how each is
started lives beside the simulator (``hubpool_sim.routers``), which the bench runs as processes:
``python -m hubpool_sim.routers list`` says which can run here, ``... run NAME`` becomes one.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from typing import Any

#: SGLang's two cache-aware configurations, the ones the equal-boxes goals are judged against
SGLANG_CACHE_AWARE = ("sglang-cache-aware", "sglang-cache-aware-home")
INSTALL = "uv sync --group routers (or: uv run --group routers hubpool bench pool)"


@functools.cache
def routers() -> dict[str, dict[str, Any]]:
    """name -> {missing: why it cannot run here or None, needsHealth}; empty without the simulator."""
    try:
        out = subprocess.run([sys.executable, "-m", "hubpool_sim.routers", "list"], capture_output=True, text=True,
                             timeout=60, check=True).stdout
        return {r["name"]: r for r in json.loads(out)}
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError):
        return {}


def router_names() -> tuple[str, ...]:
    return tuple(routers())


def argv(name: str, port: int, prometheus_port: int, workers: list[str]) -> list[str]:
    return [sys.executable, "-m", "hubpool_sim.routers", "run", name, "--port", str(port), "--prometheus-port",
            str(prometheus_port), *(x for w in workers for x in ("--worker", w))]
