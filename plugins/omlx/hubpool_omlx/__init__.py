"""hubpool engine plugin: oMLX."""

from hubpool_core import hookimpl
from hubpool_omlx.engine import OmlxEngine


@hookimpl
def hubpool_register_engines(register):
    """Register the oMLX engine."""
    register(OmlxEngine)
