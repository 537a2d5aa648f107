"""hubpool-sim: a simulated LLM inference engine for hubpool's tests, demo and benchmarks.

It speaks Ollama's native dialect and the OpenAI-compatible one as five real engines do
(ollama, vllm, llamacpp, lemonade, omlx), on a real socket, with configurable speed, slots, a
prompt cache and the faults hubpool must survive. See sim/README.md.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module that defines it. Loaded on first use: every `hubpool serve`
#: process loads this package's hubpool plugin (it adds `hubpool demo` to the CLI), and the
#: simulator's server (aiohttp's web framework) must not become resident in a node for that.
_EXPORTS = {
    "FLAVOR_NAMES": "hubpool_sim.config",
    "SimConfig": "hubpool_sim.config",
    "SimModel": "hubpool_sim.config",
    "Fault": "hubpool_sim.faults",
    "parse_fault": "hubpool_sim.faults",
    "FLAVORS": "hubpool_sim.flavors",
    "SimServer": "hubpool_sim.server",
    "ThreadedSimServer": "hubpool_sim.server",
    "run_in_thread": "hubpool_sim.server",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hubpool_sim' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
