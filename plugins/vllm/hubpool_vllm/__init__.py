"""hubpool engine plugin: vLLM."""

from hubpool_core import hookimpl
from hubpool_vllm.engine import VllmEngine


@hookimpl
def hubpool_register_engines(register):
    """Register the vLLM engine."""
    register(VllmEngine)
