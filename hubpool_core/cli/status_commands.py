"""`hubpool status`, and the kill switches `hubpool enable` / `hubpool disable`
(protocol.md §5c; spec: Kill switches, Operator status and routing log)."""

from __future__ import annotations

import json
from typing import Any

import typer

from hubpool_core.cli.client import NodeError
from hubpool_core.cli.commands import UrlOption, _client, _fail, app
from hubpool_core.cli.format import (
    counts_line,
    flag,
    labelled,
    load_lines,
    peers_table,
    plural,
    printable,
    table,
    when,
)
from hubpool_core.cli.pairing_commands import YesOption, _call, _confirm

P = "/api/inference/pool"
JsonText = typer.Option(False, "--json", help="Print the node's status answer as JSON instead of text.")

POOLING = {
    "active": "✓ active",
    "no_peers": "○ enabled, not routing — no connected peers",
    "partially_disabled": "○ partly disabled",
    "disabled_by_env": "✗ disabled — env (HUB_POOL_USER_DISABLED=true)",
    "disabled_by_setting": "✗ disabled — settings (poolEnabled=false)",
}
#: per direction: the setting, the environment flag, and what "on" means
DIRECTIONS = {
    "outbound": ("poolOutboundEnabled", "HUB_POOL_OUTBOUND_DISABLED", "this node may send work to peers"),
    "inbound": ("poolInboundEnabled", "HUB_POOL_INBOUND_DISABLED", "this node serves work peers send it"),
}


def responsible_switch(status: dict[str, Any], direction: str | None) -> str | None:
    """The switch that keeps pooling (or one direction) off, in the precedence order, or
    None when it is on."""
    if not status.get("enabled"):
        if status.get("disabledBy") == "env":
            return "HUB_POOL_USER_DISABLED=true in this node's environment"
        return "poolEnabled=false in settings"
    if direction is None:
        return None
    d = (status.get("directions") or {}).get(direction) or {}
    if d.get("enabled", True):
        return None
    setting, env_flag, _ = DIRECTIONS[direction]
    if d.get("disabledBy") == "env":
        return f"{env_flag}=true in this node's environment"
    return f"{setting}=false in settings"


def pooling_text(status: dict[str, Any]) -> str:
    reason = str(status.get("reason"))  # as a str: a non-str value matches no key either way
    text = POOLING.get(reason, reason)
    if status.get("reason") == "partially_disabled":
        dirs = status.get("directions") or {}
        off = [name for name in DIRECTIONS if not (dirs.get(name) or {}).get("enabled", True)]
        text += f" — {' and '.join(off)} off" if off else " — every connected peer is switched off here"
    elif status.get("reason") == "active":
        n = (status.get("peerCounts") or {}).get("connected", 0)
        text += f" — routing with {plural(n, 'connected peer')}"
    return text


def _store_lines(s: dict[str, Any]) -> list[str]:
    """The database (docs/postgres.md) and the routing history (docs/history.md), when the node says."""
    lines = []
    db = s.get("database")
    if db:
        where = f"{db.get('backend')} at {db.get('url')}"
        if db.get("available"):
            lines.append(labelled("Database", f"{where} — answering"))
        else:
            lines.append(labelled("Database", f"{where} — UNREACHABLE since {when(db.get('downSince'))} "
                                              f"({db.get('error') or 'no answer'}); routing goes on from memory, "
                                              "changes wait for it"))
    history = s.get("history")
    if history:
        if not history.get("enabled") and history.get("error"):
            lines.append(labelled("History", f"off — {history['error']}"))
        elif not history.get("enabled"):
            lines.append(labelled("History", "off (HUB_POOL_HISTORY=sqlite keeps routing decisions across restarts)"))
        else:
            text = (f"on — {history.get('written', 0)} rows written, kept {history.get('retentionDays')} days, "
                    f"batches every {history.get('flushMs')} ms")
            if history.get("error"):
                text += f"; {history.get('backlog', 0)} waiting: {history['error']}"
            lines.append(labelled("History", text))
    return lines


def _environment_line(s: dict[str, Any]) -> list[str]:
    held = s.get("environmentOverrides") or {}
    if not held:
        return []
    parts = []
    for key, h in held.items():
        shown = ",".join(h["value"]) if isinstance(h["value"], list) else flag(h["value"])
        parts.append(f"{h['variable']}={shown} over {key}")
    return [labelled("Environment", " · ".join(parts))]


def _status_lines(s: dict[str, Any]) -> list[str]:
    lines = [labelled("Pooling", pooling_text(s))]
    for name, (_, _, meaning) in DIRECTIONS.items():
        switch = responsible_switch(s, name)
        lines.append(labelled(name.capitalize(), f"off — {switch}" if switch else f"on — {meaning}"))
    c = s.get("peerCounts") or {}
    lines.append(labelled("Peers", f"{c.get('total', 0)} total · {c.get('connected', 0)} connected · "
                                   f"{c.get('pending', 0)} pending · {c.get('unreachable', 0)} unreachable · "
                                   f"{c.get('disabled', 0)} disabled"))
    if s.get("tailscaleAdminApiConfigured"):
        discovery = "Tailscale Admin API credential configured: `hubpool discover` can list the whole tailnet"
    else:
        discovery = ("no Tailscale Admin API credential (optional): `hubpool discover` lists the peers this "
                     "node's Tailscale daemon sees; `hubpool probe <address>` finds a Hub by address")
    lines.append(labelled("Discovery", discovery))
    st = s.get("settings") or {}
    lines.append(labelled("Settings", f"poolEnabled={flag(st.get('poolEnabled'))} · "
                                      f"outbound={flag(st.get('poolOutboundEnabled'))} · "
                                      f"inbound={flag(st.get('poolInboundEnabled'))} · "
                                      f"localAffinity={flag(st.get('poolLocalAffinity'))} · "
                                      f"healthPoll={flag(st.get('poolHealthPollSeconds'))}s"))
    lines += _environment_line(s)
    lines.append(labelled("Routing log", counts_line(s.get("routing") or {})))
    lines += _store_lines(s)
    lines += [""] + _this_node(s) + [""] + _pins(s) + [""] + _peers(s)
    for block in (load_lines(s.get("localNode"), s.get("peers") or []), _context_caps(s), _measured_speed(s),
                  _residency(s)):
        if block:
            lines += [""] + block
    return lines


def _cap_reading(peer: dict[str, Any]) -> str:
    """Three readings that never share a cell: a number, none (answered, no cap), ? (unknown)."""
    if peer.get("maxNumCtx"):
        return str(peer["maxNumCtx"])
    return "none" if peer.get("lastCapabilities") else "?"


def _context_caps(s: dict[str, Any]) -> list[str]:
    own = (s.get("localNode") or {}).get("maxNumCtx")
    peers = [p for p in s.get("peers") or [] if p.get("status") == "connected"]
    readings = {"this node": str(own) if own else "none", **{p["nodeFqdn"]: _cap_reading(p) for p in peers}}
    numbers = {n: int(r) for n, r in readings.items() if r.isdigit()}
    if not numbers:
        return []  # shown once any node is capped
    lines = ["Context caps"] + [f"  {name:<40} {reading}" for name, reading in readings.items()]
    uncapped = [n for n, r in readings.items() if r == "none"]
    if uncapped:
        lines.append(f"  ! {', '.join(uncapped)} state no cap among capped nodes: they read as 'takes any window' "
                     "and collect the windows their engine may not run (`hubpool context-cap N` there)")
    if len(set(numbers.values())) > 1:
        lines.append("  ! caps disagree: a low-capped node stops taking large windows while passing every health check")
    return lines


def _speed_rows(node: str, estimates: list[dict[str, Any]], source: str) -> list[str]:
    rows = []
    for e in estimates or []:
        bands = ", ".join(f"{b.get('tokensPerSec')} tok/s from {b.get('fromTokens')}"
                          + (" (missed its deadline)" if b.get("deadline") else "") for b in e.get("prefill") or [])
        if bands:
            rows.append(f"  {node:<34} {e.get('backend', '?'):<9} {e.get('model', '?'):<20} {bands}  [{source}]")
    return rows


def _measured_speed(s: dict[str, Any]) -> list[str]:
    rows = _speed_rows("this node", (s.get("localNode") or {}).get("throughput") or [], "own")
    for p in s.get("peers") or []:
        t = p.get("throughput") or {}
        rows += _speed_rows(p.get("nodeFqdn") or "?", t.get("observed") or [], "timed here")
        rows += _speed_rows(p.get("nodeFqdn") or "?", t.get("advertised") or [], "advertised")
    return ["Measured speed (prefill)"] + rows if rows else []


def _dialects(backend: dict[str, Any]) -> str:
    """What an engine answers natively; the agent dialects it does not are translated."""
    agent = ("messages", "count-tokens", "responses", "rerank")
    native = [d for d in backend.get("dialects") or [] if d in agent]
    base = [d for d in backend.get("dialects") or [] if d not in agent]
    text = ", ".join(base + native)
    if backend.get("agentDialectsKnown") is False:
        return text + " (agent dialects not known yet)"
    missing = [d for d in agent if d not in native and d != "rerank"]
    return text + (f"; translates {', '.join(missing)}" if missing else "")
def _residency(s: dict[str, Any]) -> list[str]:
    """Resident models and measured load times per node and engine (predicted TTFT's evidence)."""
    rows = []

    def add(node: str, resident: list[dict[str, Any]] | None, speed: list[dict[str, Any]]) -> None:
        loads = {(e.get("backend"), e.get("model")): float(e["loadMs"]) for e in speed or [] if e.get("loadMs")}
        for entry in resident or []:
            held = entry.get("models")
            shown = "unknown" if held is None else (", ".join(held) if held else "nothing")
            rows.append(f"  {node:<34} {entry.get('backend', '?'):<9} resident: {shown}")
        for (backend, model), ms in loads.items():
            rows.append(f"  {node:<34} {backend or '?':<9} {model}: loads in {ms / 1000:.1f} s (measured)")

    local = s.get("localNode") or {}
    add("this node", local.get("resident"), local.get("speed") or [])
    for p in s.get("peers") or []:
        speed = p.get("speed") or {}
        seen = (speed.get("observed") or []) + (speed.get("advertised") or [])
        add(p.get("nodeFqdn") or "?", p.get("resident"), seen)
    return ["Resident models and load times"] + rows if rows else []


def _this_node(s: dict[str, Any]) -> list[str]:
    n = s.get("localNode") or {}
    lines = ["This node", labelled("Node", n.get("nodeFqdn") or "no tailnet name yet", "  ")]
    if n.get("tailscaleConnected"):
        lines.append(labelled("Tailscale", f"connected · tailnet {n.get('tailnet') or '-'}", "  "))
    else:
        lines.append(labelled("Tailscale", "not connected — peers cannot reach this node by name", "  "))
    if n.get("hardwareTier"):
        lines.append(labelled("Hardware", str(n["hardwareTier"]), "  "))
    lines.append(labelled("In flight", str(n.get("inFlightRequests", 0)), "  "))
    backends = sorted(n.get("backends") or [], key=lambda b: not b.get("healthy"))  # working engines first
    if not backends:
        lines.append(labelled("Engines", "none configured", "  "))
    width = max((len(str(b.get("type"))) for b in backends), default=0)
    for i, b in enumerate(backends):
        models = b.get("modelsLoaded") or []
        text = f"{str(b.get('type')):<{width}} {'✓' if b.get('healthy') else '✗'} {len(models)}"
        error = None if b.get("healthy") else b.get("error")
        if b.get("url") and not (error and b["url"] in error):
            text += f"  {b['url']}"
        if error:
            text += f"  ({error})"
        lines.append(labelled("Engines" if i == 0 else "", text, "  "))
        if b.get("healthy") and b.get("dialects"):
            lines.append(labelled("", "  serves " + _dialects(b), "  "))
    if n.get("capabilitiesError"):
        lines.append(labelled("", f"({n['capabilitiesError']})", "  "))
    ident = n.get("identity") or {}
    if ident.get("publicKeyFingerprint"):
        text = f"key fingerprint {ident['publicKeyFingerprint']}"
        if ident.get("identityError"):
            text += f" — cannot sign: {ident['identityError']} (recover with `hubpool rotate-identity`)"
    else:
        text = f"no usable identity: {ident['identityError']}" if ident.get("identityError") else \
            "no identity yet (minted on first use)"
    lines.append(labelled("Identity", text, "  "))
    pin = s.get("pairingPin") or {}
    if pin.get("active"):
        lines.append(labelled("Pairing", f"PIN outstanding until {when(pin.get('expiresAt'))}", "  "))
    for key, label, setby in (("maxPromptTokens", "Ceiling", "maxPromptTokensSetBy"), ("maxNumCtx", "Context", None),
                              ("ollamaSlots", "Slots", None)):
        if n.get(key):
            by = f" (set by {n[setby]})" if setby and n.get(setby) else ""
            lines.append(labelled(label, f"{n[key]}{by}", "  "))
    return lines


def _pins(s: dict[str, Any]) -> list[str]:
    pins = s.get("pins") or []
    if not pins:
        return ["Pins", "  none — the ranker alone decides (`hubpool pin <node|local> [--model ID]` adds one)"]
    rows = []
    for p in pins:
        scope = "every model (default)" if p.get("scope") == "default" else str(p.get("model"))
        if p.get("targetKind") == "local":
            target = "local"
        else:
            target = p.get("nodeFqdn") or f"peer {str(p.get('targetPeerId'))[:8]} (no longer paired)"
        state = "available" if p.get("targetAvailable") else \
            "not available — the pin is a no-op until its target can serve"
        rows.append(["  " + scope, f"prefer {target}", state])
    return ["Pins"] + table([("  SCOPE", 22), ("TARGET", 42), ("NOW", 0)], rows)


def _peers(s: dict[str, Any]) -> list[str]:
    peers = s.get("peers") or []
    if not peers:
        return ["Peers", "  none paired — find one with `hubpool discover` or `hubpool probe <address>`"]
    lines = ["Peers"] + peers_table(peers)
    bearer = [p.get("nodeFqdn") for p in peers if p.get("authMode") != "signed"]
    required = (s.get("settings") or {}).get("poolRequireSignedPeers")
    if not bearer:
        text = "every peer signs its requests — poolRequireSignedPeers " + \
               ("is on" if required else "is safe to turn on")
    elif required:
        # the upgrade route answers 403 while the setting is on: these never come back by themselves
        text = (f"still on bearer tokens: {', '.join(bearer)} — poolRequireSignedPeers is on, so "
                f"{'that pairing is' if len(bearer) == 1 else 'those pairings are'} down and cannot upgrade while "
                "it is: the only ways back are turning the setting off (`hubpool settings "
                "poolRequireSignedPeers=false`; each then upgrades at its next health check) or re-pairing with a PIN")
    else:
        text = (f"still on bearer tokens: {', '.join(bearer)} — keep poolRequireSignedPeers off until "
                f"{'it upgrades' if len(bearer) == 1 else 'they upgrade'} (turning it on now takes "
                f"{'that pairing' if len(bearer) == 1 else 'those pairings'} down)")
    lines += ["", labelled("Peer auth", text)]
    refusing = [p for p in peers if (p.get("probeFailure") or {}).get("kind") in ("identity_changed", "unauthorized")]
    if refusing:
        lines += ["", "Peers refusing this Hub"]
        for p in refusing:
            f = p["probeFailure"]
            name = p.get("nodeFqdn") or "?"
            kind = "identity changed" if f["kind"] == "identity_changed" else "credentials refused"
            status = f"HTTP {f['httpStatus']}" if f.get("httpStatus") else "refused"
            lines.append(f"  {str(p.get('id'))[:8]} {name}: {kind} ({status}, since {when(f.get('since'))}, "
                         f"{plural(f.get('attempts') or 1, 'attempt')})")
            if f.get("action"):
                lines.append("    " + str(f["action"]).replace("<peer>", name))
    # neither clears by waiting: poolRequireSignedPeers holds a bearer-only pairing off, and
    # this node's own unusable key fails every peer until rotation
    lines += _failure_block(peers, "signed_required",
                            "Peers held off by poolRequireSignedPeers (they do not rejoin by themselves)")
    lines += _failure_block(peers, "own_identity", "Peers this Hub cannot reach: its own pool key cannot be used")
    return lines


def _failure_block(peers: list[dict[str, Any]], kind: str, title: str) -> list[str]:
    """The peers whose probe failed with ``kind``, under ``title``, each with its action."""
    lines = []
    for p in peers:
        f = p.get("probeFailure") or {}
        if f.get("kind") != kind:
            continue
        lines.append(f"  {str(p.get('id'))[:8]} {p.get('nodeFqdn') or '?'}: since {when(f.get('since'))}, "
                     f"{plural(f.get('attempts') or 1, 'attempt')}")
        if f.get("action"):
            lines.append("    " + str(f["action"]))
    return ["", title, *lines] if lines else []


@app.command()
def status(url: str | None = UrlOption, as_json: bool = JsonText) -> None:
    """Show whether pooling is on and which switch decides, this node, its pins and peers,
    and the routing-log counts."""
    data = _call(url, "GET", P + "/status")
    if as_json:
        print(json.dumps(data, indent=2))
        return
    # peers name their models and engines: what they say is shown, never obeyed by the terminal
    print("\n".join(printable(line) for line in _status_lines(data)))


# -- kill switches ---------------------------------------------------------------------

def _switch(on: bool, outbound: bool, inbound: bool, yes: bool, url: str | None, as_json: bool) -> None:
    if outbound and inbound:
        _fail("give at most one of --outbound and --inbound (without either, the master switch is changed)")
    direction = "outbound" if outbound else "inbound" if inbound else None
    key = DIRECTIONS[direction][0] if direction else "poolEnabled"
    what = f"{direction} pooling" if direction else "pooling"
    if on:
        question = f"Turn {what} on for this node?"
    elif direction == "outbound":
        question = "Turn outbound pooling off? This node keeps its own work and sends nothing to peers."
    elif direction == "inbound":
        question = "Turn inbound pooling off? Peers stop sending work here; this node still uses them."
    else:
        question = ("Turn pooling off for this node? Peers mark it unreachable within three polls (the pairings "
                    "are kept), and its apps use only this node's engines.")
    _confirm(question, yes)
    client = _client(url)
    try:
        before = client.get(P + "/settings").get(key)
        client.patch(P + "/settings", {key: on})
        after = client.get(P + "/status")
    except NodeError as exc:
        _fail(str(exc))
    if as_json:
        print(json.dumps(after, indent=2))
        return
    changed = "is now" if before != on else "was already"
    master = responsible_switch(after, None)
    switch = responsible_switch(after, direction)
    if on and switch:
        keeps = "keeps pooling off" if master else f"keeps {direction} pooling off"
        print(f"{key} {changed} {flag(on)}, but {switch} {keeps}: nothing changed in what this node does.")
        if "environment" in switch:
            print("Remove that flag from the node's environment and restart it; the setting then takes effect.")
        else:
            print("Run `hubpool enable` to turn the master switch on.")
    else:
        print(f"{key} {changed} {flag(on)}.")
        if not on and switch and not switch.startswith(key + "="):
            print(f"({switch} keeps it off as well.)")
    print(labelled("Pooling", pooling_text(after)))


OutboundOption = typer.Option(False, "--outbound", help="Only the outbound direction: whether this node sends "
                                                        "work to peers.")
InboundOption = typer.Option(False, "--inbound", help="Only the inbound direction: whether this node serves work "
                                                      "peers send it.")
SwitchJson = typer.Option(False, "--json", help="Print the node's status after the change as JSON.")


@app.command()
def enable(outbound: bool = OutboundOption, inbound: bool = InboundOption, yes: bool = YesOption,
           url: str | None = UrlOption, as_json: bool = SwitchJson) -> None:
    """Turn pooling on (the master switch), or one direction with --outbound or --inbound.
    Says so when an environment flag keeps it off anyway."""
    _switch(True, outbound, inbound, yes, url, as_json)


@app.command()
def disable(outbound: bool = OutboundOption, inbound: bool = InboundOption, yes: bool = YesOption,
            url: str | None = UrlOption, as_json: bool = SwitchJson) -> None:
    """Turn pooling off (the master switch), or one direction with --outbound or --inbound.
    Pairings are kept; `hubpool enable` undoes it."""
    _switch(False, outbound, inbound, yes, url, as_json)
