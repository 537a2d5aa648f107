"""hubpool engine plugin: Lemonade Server."""

from hubpool_core import hookimpl
from hubpool_lemonade.engine import LemonadeEngine


@hookimpl
def hubpool_register_engines(register):
    """Register the Lemonade engine."""
    register(LemonadeEngine)
