"""hubpool engine plugin: Ollama."""

from hubpool_core import hookimpl
from hubpool_ollama.engine import OllamaEngine


@hookimpl
def hubpool_register_engines(register):
    """Register the Ollama engine."""
    register(OllamaEngine)
