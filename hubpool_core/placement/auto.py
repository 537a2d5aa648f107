"""The ``auto`` alias: which model stands in for it, across the whole pool (spec: The auto
alias). Resolved against every node that could take the request, before candidates are
ranked, so a peer holding the model is as eligible as the local engine."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
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
#: a size such as 8b or 1.5b; never part of a longer number, nor a mixture of experts' active
#: count (the a3b of qwen3:30b-a3b: 3 B active of 30 B), which says nothing of the model's size
_PARAMS = re.compile(r"(?<![\d.])(?<!\ba)(\d+(?:\.\d+)?)\s*b\b", re.IGNORECASE)
#: an Ollama Cloud tag: the tag is "cloud" or ends in "-cloud" (gpt-oss:120b-cloud, kimi-k2:1t-cloud)
_CLOUD_TAG = re.compile(r"(?:^|-)cloud$", re.IGNORECASE)


def _params_b(model: str) -> float | None:
    """Billions of parameters the id states (the last size in its name), the total for a
    mixture of experts (``qwen3:235b-a22b`` is 235); None when it states none."""
    tag = model.rsplit("/", 1)[-1]
    found = _PARAMS.findall(tag.replace(":", " ").replace("-", " "))
    return float(found[-1]) if found else None


def is_cloud_tag(model: str) -> bool:
    """An Ollama Cloud model: running it sends the prompt off the machine. The pool never
    chooses one for an app; only the operator's own Settings → Inference choice can name one."""
    name = fold_model_id(model)
    colon = name.rfind(":")
    return colon > name.rfind("/") and _CLOUD_TAG.search(name[colon + 1:]) is not None


def is_chat_model(model: str) -> bool:
    """Not an embedding or rerank model, as far as its name says (the listings say no more)."""
    return _NOT_CHAT.search(model) is None


def _size_tier(params: float | None) -> int:
    """7 B or more first; a size the id does not state next (unknown is not tiny); then the small."""
    if params is None:
        return 1
    return 0 if params >= AUTO_MIN_PARAMS_B else 2


def choose_auto_model(offers: dict[str, set[str]], preferred: str | None) -> str | None:
    """offers: model id → the nodes serving it ("local" among them when this node does).

    Order (spec: "The auto alias"): the operator's preferred model wherever it is served,
    when it is a chat model; else chat models only (never embeddings, rerankers or an
    Ollama Cloud tag), 7 B or more first, then a size nobody states, then the smaller ones;
    within those, parameter count, how many nodes serve it, whether this node does, and the
    id. The spec's first key, tool support, and its catalog intelligence index are not known
    here (no engine lists either, and a peer publishes model names only): every model is
    "tools unknown", and parameter count stands in for the index (README, Routes).
    None: no chat model.
    """
    if preferred and is_chat_model(preferred):
        for model in offers:
            if same_model(model, preferred):
                return model
    chat = [m for m in offers if is_chat_model(m) and not is_cloud_tag(m)]
    if not chat:
        return None

    def key(m: str) -> tuple[int, float, int, int, str]:
        params = _params_b(m)
        return (_size_tier(params), -(params or 0), -len(offers[m]), 0 if "local" in offers[m] else 1, m)

    return sorted(chat, key=key)[0]


def pool_offers(backends: list[LocalBackend], peers: list[PoolPeer],
                unservable: Callable[[str, str], Collection[str]] | None = None) -> dict[str, set[str]]:
    """model id -> the nodes that could serve it ("local" for this node). ``unservable``
    (node, engine kind) -> folded ids withheld there: this node's withheld models are not
    offered (a peer already leaves its own out of what it advertises)."""
    offers: dict[str, set[str]] = {}
    for b in backends:
        if b.healthy:
            withheld = unservable("local", b.engine.kind) if unservable is not None else ()
            for m in b.snapshot.result.models:
                if fold_model_id(m.id) not in withheld:
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


def resolve_auto(backends: list[LocalBackend], peers: list[PoolPeer], preferred: str | None,
                 unservable: Callable[[str, str], Collection[str]] | None = None) -> str | None:
    """The model ``auto`` stands for on this node now (the Settings → Inference choice is
    ``preferred``), or None when no node in the pool serves a chat model."""
    return choose_auto_model(pool_offers(backends, peers, unservable), preferred)
