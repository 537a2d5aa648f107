"""Placement: who could serve a request, and in what order (spec: Ranking; protocol.md §4).

- ``plan.py``: the entry — a request description and the node's snapshot in, one call
  (:func:`place`; :func:`place_inbound` for ``/local/*``) out: the ordered candidates, the
  routing-log sections, the budget and, when nobody can serve it, the 502 diagnosis.
- ``candidates.py``: who could serve a model (local engines, usable peers) and the base
  ranker's order; the hardware tiers.
- ``load.py``: queue depth as the proxy counts it, local and per peer.
- ``pipeline.py``: the context stages read, and the stage pipeline with pins and withheld
  engines last.
- ``pins.py``: operator pins — which applies, and moving its node to the front.
- ``auto.py``: what the ``auto`` alias stands for across the pool.
- ``aliases.py``: model aliases (``poolModelAliases``), for names no node serves.
- ``sessions.py``: which session a request belongs to, from the ids agents send.
- ``throughput.py``: measured throughput, the evidence the throughput stages read.
- ``speed.py``: what predicted time to first token reads: measured speed, load times,
  residency, the slots a candidate runs (hubpool's own, docs/placement.md).
- ``quarantine.py``: engines withheld for a model after repeated faults.
- ``handout.py``: the client handout and the effective prompt ceiling.

This package's top-level names are what placement stages (plugins) import.
"""

from hubpool_core.models_ids import fold_model_id, same_model  # re-exported for stages
from hubpool_core.placement.auto import AUTO, AUTO_NOTHING, choose_auto_model, pool_offers, resolve_auto
from hubpool_core.placement.candidates import (
    TIER_RANK,
    Candidate,
    build_candidates,
    is_fresh,
    peer_offers,
    usable_peers,
)
from hubpool_core.placement.load import Load
from hubpool_core.placement.pins import apply_pin, find_pin, pin_matches, pin_note
from hubpool_core.placement.pipeline import JUDGED_ROUTES, PlacementContext, request_num_ctx, run_stages
from hubpool_core.placement.plan import (
    NO_AUTO_MODEL,
    InboundPlan,
    NoAutoModel,
    NodeSnapshot,
    PlacementRequest,
    Plan,
    place,
    place_inbound,
    snapshot_of,
)

__all__ = [
    "AUTO",
    "AUTO_NOTHING",
    "JUDGED_ROUTES",
    "NO_AUTO_MODEL",
    "TIER_RANK",
    "Candidate",
    "InboundPlan",
    "Load",
    "NoAutoModel",
    "NodeSnapshot",
    "PlacementContext",
    "PlacementRequest",
    "Plan",
    "apply_pin",
    "build_candidates",
    "choose_auto_model",
    "find_pin",
    "fold_model_id",
    "is_fresh",
    "peer_offers",
    "pin_matches",
    "pin_note",
    "place",
    "place_inbound",
    "pool_offers",
    "request_num_ctx",
    "resolve_auto",
    "run_stages",
    "same_model",
    "snapshot_of",
    "usable_peers",
]
