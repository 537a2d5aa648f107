"""Model aliases (hubpool's own, beyond the spec): ``poolModelAliases`` maps a model name an app
asks for, or a glob pattern of names, to a pool model or ``auto``.

An agent names models the pool does not hold: Claude Code's background model is
``claude-haiku-4-5-…`` unless its user sets ANTHROPIC_DEFAULT_HAIKU_MODEL, and a client's
default model is a cloud one. An alias resolves those on the node, once, for every client.

An alias applies only to a name no node of the pool serves: a model a node lists is always
placed as itself, so a pattern can never take a real model away from the apps that ask for it.
Exact names are tried before patterns, then patterns in the order written; names compare
case-insensitively. The name asked stays visible: the routing log's ``requestedModel`` and the
``X-Hub-Pool-Model-Requested`` response header carry it beside the model placed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from fnmatch import fnmatchcase

#: glob characters: a key with none of them is an exact name
_GLOB = set("*?[")


def alias_target(aliases: Mapping[str, str], model: str, served: Callable[[str], bool]) -> tuple[str, str] | None:
    """``(target, key)`` of the alias that resolves ``model``, or None when none applies.

    ``served(model)`` says whether some node of the pool lists ``model``; it is asked only
    when a key matches, so a request whose model matches no key costs a dictionary scan."""
    if not aliases:
        return None
    wanted = model.lower()
    exact = next((k for k in aliases if not _GLOB & set(k) and k.lower() == wanted), None)
    key = exact or next((k for k in aliases if _GLOB & set(k) and fnmatchcase(wanted, k.lower())), None)
    if key is None or served(model):
        return None
    return aliases[key], key
