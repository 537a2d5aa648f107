"""Placement stages from the spec: prefix affinity (order 100), the context cap, prompt
ceiling and slot splits (200, 300, 400) and local engine contention (order 600, before the
pin)."""

from hubpool_core import hookimpl
from hubpool_stages.affinity import PrefixAffinityStage, session_key
from hubpool_stages.contention import LocalContentionStage
from hubpool_stages.splits import ContextCapStage, PromptCeilingStage, SlotsStage

__all__ = ["ContextCapStage", "LocalContentionStage", "PrefixAffinityStage", "PromptCeilingStage", "SlotsStage",
           "session_key"]


@hookimpl
def hubpool_register_stages(register):
    """Register prefix affinity (100), the context cap (200), prompt ceiling (300) and slot
    (400) splits, and local engine contention (600)."""
    register(PrefixAffinityStage)
    register(ContextCapStage)
    register(PromptCeilingStage)
    register(SlotsStage)
    register(LocalContentionStage)
