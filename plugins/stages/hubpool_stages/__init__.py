"""Placement stages from the spec: prefix affinity (order 100) and local engine contention
(order 600, before the pin)."""

from hubpool_core import hookimpl
from hubpool_stages.affinity import PrefixAffinityStage, session_key
from hubpool_stages.contention import LocalContentionStage

__all__ = ["LocalContentionStage", "PrefixAffinityStage", "session_key"]


@hookimpl
def hubpool_register_stages(register):
    """Register prefix affinity (order 100) and local engine contention (order 600)."""
    register(PrefixAffinityStage)
    register(LocalContentionStage)
