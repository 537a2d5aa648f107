"""`hubpool pin` / `hubpool unpin`: operator routing pins (spec: Manual routing pins).
A pin reorders and never forces: its node goes first when it can serve the model."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import typer

from hubpool_core.cli.client import NodeError
from hubpool_core.cli.commands import UrlOption, _client, _fail, app
from hubpool_core.cli.pairing_commands import _call

P = "/api/inference/pool"
ModelOption = typer.Option(None, "--model", help="Pin only this model id, exactly as the engines list it "
                                                  "(e.g. llama3.2:3b). Without it, the pool-wide default pin.")
PinJson = typer.Option(False, "--json", help="Print the node's answer (every pin) as JSON instead of text.")


def resolve_peer(rows: list[dict[str, Any]], ident: str) -> dict[str, Any]:
    """A peer by full id, tailnet name, unique ID prefix (4+ characters) or unique short
    host name, as the approve verb resolves it; otherwise a sentence for the operator."""
    key = ident.strip().lower().rstrip(".")
    for row in rows:
        if key in (str(row.get("id", "")).lower(), str(row.get("nodeFqdn", "")).lower()):
            return row
    matches = [r for r in rows if len(key) >= 4 and str(r.get("id", "")).lower().startswith(key)]
    if len(matches) > 1:
        _fail(f"{ident!r} matches {len(matches)} peers; give more of the ID (see `hubpool peers`)")
    if not matches:
        matches = [r for r in rows if str(r.get("nodeFqdn", "")).split(".")[0] == key]
        if len(matches) != 1:
            _fail(f"no pool peer with that id or name: {ident!r} (see `hubpool peers`, or pin `local`)")
    return matches[0]


def _describe(scope: str, model: str | None) -> str:
    return f"the pin for {model}" if scope == "model" else "the default pin (every model)"


@app.command()
def pin(target: str = typer.Argument(..., help="`local` for this node, or a peer: ID prefix, full ID or tailnet "
                                               "name (see `hubpool peers`)."),
        model: str | None = ModelOption, url: str | None = UrlOption, as_json: bool = PinJson) -> None:
    """Prefer a node for one model (--model) or for every model. Replaces an existing pin of
    the same scope; a pin reorders candidates and never makes a request fail."""
    body: dict[str, Any] = {"scope": "model" if model else "default", "targetKind": "local"}
    if model:
        body["model"] = model
    name = "this node (local)"
    if target.strip().lower() != "local":
        peer = resolve_peer(_call(url, "GET", P + "/peers"), target)
        body.update(targetKind="peer", targetPeerId=peer["id"])
        name = peer.get("nodeFqdn") or peer["id"]
    answer = _call(url, "POST", P + "/pins", body)
    if as_json:
        print(json.dumps(answer, indent=2))
        return
    print(f"Pinned {'model ' + model if model else 'every model (default pin)'} to {name}: it goes first whenever "
          "it can serve, and the ranker orders everything behind it.")
    state = _pin_state(url, body)
    if state is False:
        print("It cannot serve that right now, so until it can the pin changes nothing (`hubpool status` shows "
              "when it becomes available).")


def _pin_state(url: str | None, body: dict[str, Any]) -> bool | None:
    """targetAvailable for the pin just written, or None when status could not be read."""
    try:
        status = _client(url).get(P + "/status")
    except NodeError:
        return None
    for p in status.get("pins") or []:
        if (p.get("scope"), p.get("model")) == (body["scope"], body.get("model")):
            return bool(p.get("targetAvailable"))
    return None


@app.command()
def unpin(model: str | None = typer.Option(None, "--model", help="Remove the pin for this model id. Without "
                                                                    "it, the default pin is removed."),
          url: str | None = UrlOption, as_json: bool = PinJson) -> None:
    """Remove a routing pin; the ranker alone decides again."""
    scope = "model" if model else "default"
    before = _call(url, "GET", P + "/settings").get("poolPins") or []
    query = f"scope={scope}" + (f"&model={quote(model, safe='')}" if model else "")
    answer = _call(url, "DELETE", f"{P}/pins?{query}")
    if as_json:
        print(json.dumps(answer, indent=2))
        return
    existed = any((p.get("scope"), p.get("model")) == (scope, model) for p in before)
    if existed:
        print(f"Removed {_describe(scope, model)}.")
    else:
        print(f"There was no pin for {model}; nothing changed." if model else
              "There was no default pin; nothing changed.")
