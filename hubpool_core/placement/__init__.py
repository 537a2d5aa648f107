"""Placement: who could serve a request, and in what order (spec: Ranking; protocol.md §4).

- ``ranking.py``: candidates, the queue-depth load, the base ranker, the stage pipeline
  with pins, and the ``auto`` alias.
- ``throughput.py``: measured throughput, the evidence the throughput stages read.
- ``quarantine.py``: engines withheld for a model after repeated faults.
- ``handout.py``: the client handout and the effective prompt ceiling.

This package's top-level names are what placement stages (plugins) import.
"""

from hubpool_core.models_ids import fold_model_id, same_model  # re-exported for stages
from hubpool_core.placement.ranking import (
    JUDGED_ROUTES,
    TIER_RANK,
    Candidate,
    Load,
    PlacementContext,
    apply_pin,
    build_candidates,
    choose_auto_model,
    find_pin,
    is_fresh,
    peer_offers,
    pin_matches,
    request_num_ctx,
    run_stages,
    usable_peers,
)

__all__ = [
    "JUDGED_ROUTES",
    "TIER_RANK",
    "Candidate",
    "Load",
    "PlacementContext",
    "apply_pin",
    "build_candidates",
    "choose_auto_model",
    "find_pin",
    "fold_model_id",
    "is_fresh",
    "peer_offers",
    "pin_matches",
    "request_num_ctx",
    "run_stages",
    "same_model",
    "usable_peers",
]
