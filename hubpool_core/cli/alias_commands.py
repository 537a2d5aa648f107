"""`hubpool alias add|remove|list`: the node's model aliases (poolModelAliases).

An alias maps a model name, or a glob pattern of names, that no node of the pool serves to a
pool model or ``auto`` (docs/agents.md): Claude Code's background ``claude-haiku-…``, or a
client's default model, then resolves on the node for every client at once.
"""

from __future__ import annotations

import json

import typer

from hubpool_core.cli.client import NodeError
from hubpool_core.cli.commands import JsonOption, UrlOption, _client, _fail, app, out

SETTINGS = "/api/inference/pool/settings"
KEY = "poolModelAliases"

alias_app = typer.Typer(help="Model aliases: names no node serves (claude-*), resolved to a pool model or auto.",
                        no_args_is_help=True)
app.add_typer(alias_app, name="alias")


def _aliases(url: str | None) -> dict[str, str]:
    try:
        data = _client(url).get(SETTINGS)
    except NodeError as exc:
        _fail(str(exc))
    return dict(data.get("settings", data).get(KEY) or {})


def _write(url: str | None, aliases: dict[str, str]) -> dict[str, str]:
    try:
        data = _client(url).patch(SETTINGS, {KEY: aliases})
    except NodeError as exc:
        _fail(str(exc))
    return dict(data.get(KEY) or {})


def _print(aliases: dict[str, str]) -> None:
    if not aliases:
        out.print("No model aliases: a model no node serves is refused as before.", highlight=False)
        return
    width = max(len(k) for k in aliases)
    for name, target in aliases.items():
        out.print(f"{name:<{width}}  → {target}", highlight=False)


@alias_app.command("list")
def list_aliases(url: str | None = UrlOption, as_json: bool = JsonOption) -> None:
    """Print the aliases, in the order they are tried (exact names before patterns)."""
    aliases = _aliases(url)
    if as_json:
        print(json.dumps(aliases, indent=2))
    else:
        _print(aliases)


@alias_app.command("add")
def add(name: str = typer.Argument(..., help="A model name or glob pattern, e.g. 'claude-*' or 'gpt-5-codex'."),
        target: str = typer.Argument(..., help="The pool model it resolves to, or 'auto'."),
        url: str | None = UrlOption) -> None:
    """Add an alias, or change where an existing one points. Applies only to names no node serves."""
    aliases = _aliases(url)
    before = aliases.get(name)
    aliases[name] = target
    _print(_write(url, aliases))
    if before is not None and before != target:
        out.print(f"({name} pointed at {before} before)", highlight=False)


@alias_app.command("remove")
def remove(name: str = typer.Argument(..., help="The alias's name or pattern, exactly as `hubpool alias list` "
                                                "prints it."),
           url: str | None = UrlOption) -> None:
    """Remove an alias: requests for that name are refused again unless a node serves it."""
    aliases = _aliases(url)
    if name not in aliases:
        known = ", ".join(aliases) or "none"
        _fail(f"no alias named {name!r} on this node (aliases: {known})")
    del aliases[name]
    _print(_write(url, aliases))
