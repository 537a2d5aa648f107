"""Model-id comparison shared by candidates, listings and pins."""

from __future__ import annotations


def fold_model_id(model: str) -> str:
    """``name`` and ``name:latest`` are the same model; the tag is what follows the last
    ``:`` after the last ``/`` (so a registry host's port is never taken for a tag)."""
    slash = model.rfind("/")
    colon = model.rfind(":")
    if colon > slash and model[colon + 1:] == "latest":
        return model[:colon]
    return model


def same_model(a: str, b: str) -> bool:
    return fold_model_id(a) == fold_model_id(b)
