"""hubpool-sim: a simulated LLM inference engine for hubpool's tests, demo and benchmarks.

It speaks Ollama's native dialect and the OpenAI-compatible one as five real engines do
(ollama, vllm, llamacpp, lemonade, omlx), on a real socket, with configurable speed, slots, a
prompt cache and the faults hubpool must survive. See sim/README.md.
"""

from hubpool_sim.config import FLAVOR_NAMES, SimConfig, SimModel
from hubpool_sim.faults import Fault, parse_fault
from hubpool_sim.flavors import FLAVORS
from hubpool_sim.server import SimServer, ThreadedSimServer, run_in_thread

__all__ = [
    "FLAVORS",
    "FLAVOR_NAMES",
    "Fault",
    "SimConfig",
    "SimModel",
    "SimServer",
    "ThreadedSimServer",
    "parse_fault",
    "run_in_thread",
]
