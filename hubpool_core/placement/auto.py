"""The ``auto`` alias: which model stands in for it, across the whole pool (spec: The auto
alias). Resolved against every node that could take the request, before candidates are
ranked, so a peer holding the model is as eligible as the local engine."""

from __future__ import annotations

import re
from typing import Any

from hubpool_core.models_ids import fold_model_id, same_model
from hubpool_core.signals.local_engines import LocalBackend
from hubpool_core.store import PoolPeer

#: the model id an app asks for when it leaves the choice to the pool
AUTO = "auto"
#: the 502 when nothing in the pool can stand in (spec: "A pool with no chat model anywhere")
AUTO_NOTHING = ('No chat model on this Hub or its connected peers can stand in for "auto": load a chat model on '
                "any pool node, or ask for a model by name.")
AUTO_MIN_PARAMS_B = 7

_NOT_CHAT = re.compile(r"embed|rerank|bge-|minilm|e5-", re.IGNORECASE)
_PARAMS = re.compile(r"(\d+(?:\.\d+)?)\s*b\b", re.IGNORECASE)


def _params_b(model: str) -> float | None:
    tag = model.rsplit("/", 1)[-1]
    found = _PARAMS.findall(tag.replace(":", " ").replace("-", " "))
    return float(found[-1]) if found else None


def choose_auto_model(offers: dict[str, set[str]], preferred: str | None) -> str | None:
    """offers: model id → the nodes serving it ("local" among them when this node does).

    Order: the operator's preferred model wherever it is served; else chat models only
    (never embeddings, rerankers or a :cloud tag), 7 B or more first, then parameter count,
    how many nodes serve it, whether this node does, and the id. None: no chat model.
    """
    if preferred:
        for model in offers:
            if same_model(model, preferred):
                return model
    chat = [m for m in offers if not _NOT_CHAT.search(m) and not fold_model_id(m).endswith(":cloud")]
    if not chat:
        return None

    def key(m: str) -> tuple[int, float, int, int, str]:
        params = _params_b(m)
        return (0 if params is not None and params >= AUTO_MIN_PARAMS_B else 1, -(params or 0), -len(offers[m]),
                0 if "local" in offers[m] else 1, m)

    return sorted(chat, key=key)[0]


def pool_offers(backends: list[LocalBackend], peers: list[PoolPeer]) -> dict[str, set[str]]:
    """model id -> the nodes that could serve it ("local" for this node)."""
    offers: dict[str, set[str]] = {}
    for b in backends:
        if b.healthy:
            for m in b.snapshot.result.models:
                offers.setdefault(m.id, set()).add("local")
    for p in peers:
        caps: dict[str, Any] = p.last_capabilities if isinstance(p.last_capabilities, dict) else {}
        if caps.get("acceptingWork") is False:
            continue
        for backend in caps.get("backends") or []:
            if backend.get("healthy"):
                for m in backend.get("modelsLoaded") or []:
                    offers.setdefault(m, set()).add(p.node_fqdn)
    return offers


def resolve_auto(backends: list[LocalBackend], peers: list[PoolPeer], preferred: str | None) -> str | None:
    """The model ``auto`` stands for on this node now (the Settings → Inference choice is
    ``preferred``), or None when no node in the pool serves a chat model."""
    return choose_auto_model(pool_offers(backends, peers), preferred)
