"""Placement stages: predicted time to first token (order 50, hubpool's own), and from the
spec: prefix affinity (order 100), the context cap, prompt
ceiling, slot and throughput splits (200, 300, 400, 500), local engine contention (order
600, before the pin) and much-faster placement (800, after the pin)."""

from hubpool_core import hookimpl
from hubpool_stages.affinity import PrefixAffinityStage, session_key
from hubpool_stages.contention import LocalContentionStage
from hubpool_stages.splits import ContextCapStage, PromptCeilingStage, SlotsStage
from hubpool_stages.throughput import SlowerPlacementStage, ThroughputStage
from hubpool_stages.ttft import PredictedTtftStage

__all__ = ["ContextCapStage", "LocalContentionStage", "PredictedTtftStage", "PrefixAffinityStage",
           "PromptCeilingStage", "SlotsStage", "SlowerPlacementStage", "ThroughputStage", "session_key"]


@hookimpl
def hubpool_register_stages(register):
    """Register predicted time to first token (50), prefix affinity (100), the context cap
    (200), prompt ceiling (300), slot (400) and throughput (500) splits, local engine
    contention (600) and much-faster placement (800)."""
    register(PredictedTtftStage)
    register(PrefixAffinityStage)
    register(ContextCapStage)
    register(PromptCeilingStage)
    register(SlotsStage)
    register(ThroughputStage)
    register(LocalContentionStage)
    register(SlowerPlacementStage)
