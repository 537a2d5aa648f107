"""hubpool engine plugin: llama.cpp's llama-server."""

from hubpool_core import hookimpl
from hubpool_llamacpp.engine import LlamacppEngine


@hookimpl
def hubpool_register_engines(register):
    """Register the llama-server engine."""
    register(LlamacppEngine)
