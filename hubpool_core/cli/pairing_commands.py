"""CLI verbs for finding and pairing peers: discover, probe, pairing-pin, pair, peers,
approve, reject, unpair, peer-enable, peer-disable, rotate-identity."""

from __future__ import annotations

import json
import os
import sys
from typing import Any
from urllib.parse import quote

import typer
from rich.table import Table

from hubpool_core.cli.client import NodeError
from hubpool_core.cli.commands import JsonOption, UrlOption, _client, _fail, app, err, out
from hubpool_core.cli.format import load_lines, peers_table, printable, when

P = "/api/inference/pool"
YesOption = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation (also HUB_POOL_ASSUME_YES=1).")


def _assume_yes() -> bool:
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes")
               for v in ("HUB_POOL_ASSUME_YES", "CI_HUB_ASSUME_YES"))


def _confirm(question: str, yes: bool) -> None:
    if yes or _assume_yes():
        return
    if not sys.stdin.isatty():
        _fail("this terminal cannot prompt: pass --yes (or set HUB_POOL_ASSUME_YES=1) to confirm")
    if not typer.confirm(question, default=False):
        raise typer.Exit(1)


def _call(url: str | None, method: str, path: str, body: Any = None) -> Any:
    try:
        return _client(url).request(method, path, body)
    except NodeError as exc:
        _fail(str(exc))


def _when(value: str | None) -> str:
    return when(value)


@app.command()
def discover(url: str | None = UrlOption, as_json: bool = JsonOption) -> None:
    """List unpaired Hubs this node can name (probes each candidate once)."""
    data = _call(url, "GET", P + "/peers/discoverable/full")
    if as_json:
        print(json.dumps(data, indent=2))
        return
    if not data["peers"]:
        out.print("No Hubs found. That is not an error: no unpaired Hub on your tailnet answered.")
    else:
        table = Table(box=None, pad_edge=False)
        for col in ("NODE", "HOSTNAME", "DEVICE ID", "OS", "ONLINE"):
            table.add_column(col)
        for p in data["peers"]:
            online = {True: "online", False: "offline"}.get(p.get("online"), "-")
            table.add_row(p["nodeFqdn"], p["hostname"], p["tailscaleDeviceId"] or "-", p.get("os") or "-", online)
        out.print(table)
    if data.get("unanswered"):
        out.print("\nDevices that did not answer as a Hub: " + ", ".join(u["nodeFqdn"] for u in data["unanswered"]))


@app.command()
def probe(address: str = typer.Argument(..., help="An address (192.168.1.42, 192.168.1.42:5002) or a hostname."),
          url: str | None = UrlOption, as_json: bool = JsonOption) -> None:
    """Check whether a Hub answers at a LAN address (learns no name; pair with a PIN)."""
    data = _call(url, "POST", P + "/peers/probe", {"address": address})
    if as_json:
        print(json.dumps(data, indent=2))
        return
    if data["pairable"]:
        out.print(f"✓ a Hub answers at {address} (pool protocol {data['poolProtocol']}). "
                  f"Mint a PIN on it (`hubpool pairing-pin`), then: hubpool pair {address} --pin <digits>")
    else:
        reason = {"unreachable": "nothing answered", "not_a_hub": "something answered, but not a Hub",
                  "protocol_too_old": "a Hub on an older pool protocol: pair by its tailnet name instead"}
        out.print(f"✗ {address}: {reason.get(data['reason'], data['reason'])}")
        raise typer.Exit(1)


@app.command("pairing-pin")
def pairing_pin(url: str | None = UrlOption) -> None:
    """Mint a six-digit pairing PIN (ten minutes, single use) for another Hub to pair with this one."""
    data = _call(url, "POST", P + "/pairing-pin")
    out.print(f"Pairing PIN: {data['pin']}  (expires {_when(data['expiresAt'])}; works once)")
    out.print(f"This node's key fingerprint: {data['publicKeyFingerprint'] or '-'}")
    if data.get("identityError"):
        err.print(f"warning: {data['identityError']}")


@app.command("cancel-pin")
def cancel_pin(url: str | None = UrlOption) -> None:
    """Cancel the outstanding pairing PIN."""
    _call(url, "DELETE", P + "/pairing-pin")
    out.print("Pairing PIN cancelled.")


@app.command()
def pair(node: str = typer.Argument(..., help="The other Hub's tailnet name, or with --pin a LAN address or "
                                              "LAN name (hub-b.lan)."),
         pin: str | None = typer.Option(None, "--pin", help="Six digits minted on the other Hub."),
         name: str | None = typer.Option(None, "--name", help="A display label for the peer."),
         yes: bool = YesOption, url: str | None = UrlOption) -> None:
    """Send a pairing request; an operator on the other Hub approves it there."""
    from hubpool_core.peering.signing import normalize_peer_fqdn

    is_name = normalize_peer_fqdn(node) is not None and not node.replace(".", "").isdigit()
    body: dict[str, Any] = {"nodeFqdn": node} if is_name else {"address": node}
    if pin is not None:
        body["pin"] = pin
    if name:
        body["displayName"] = name
    _confirm(f"Send a pairing request to {node}?", yes)
    row = _call(url, "POST", P + "/peers/pair", body)
    out.print(f"Request sent to {row['nodeFqdn']} (ID here {row['id'][:8]}). It waits for an operator there: "
              f"on {row['nodeFqdn']}, run `hubpool peers`, then `hubpool approve <this node's name or its ID there>`.")
    if row.get("peerKeyFingerprint"):
        out.print(f"Its key fingerprint: {row['peerKeyFingerprint']}")


@app.command()
def peers(url: str | None = UrlOption,
          as_json: bool = typer.Option(False, "--json", help="Print the node's peer list as JSON instead of a "
                                                              "table.")) -> None:
    """List paired and pending peers, with the same columns as `hubpool status` plus AUTH
    (the ID prefix is what approve, reject, unpair and pin take)."""
    rows = _call(url, "GET", P + "/peers")
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        out.print("No peers. Find one with `hubpool discover` or `hubpool probe <address>`.")
        return
    try:  # queue depth and probe verdicts are live figures only status carries
        live = {p["id"]: p for p in _client(url).get(P + "/status").get("peers") or []}
    except NodeError:
        live = {}
    merged = [{**r, **{k: live.get(r["id"], {}).get(k) for k in ("inFlightRequests", "probeFailure", "gpuPressure")}}
              for r in rows]
    print("\n".join(printable(line) for line in peers_table(merged, extra=(("AUTH", 6),),
                                                             extra_cells=lambda r: [r.get("authMode") or "-"])))
    connected = [r for r in merged if r.get("status") == "connected"]
    if connected:  # what each peer reports of its load: GPU band and containers (from /peers)
        print("\n" + "\n".join(load_lines(None, connected)))
    waiting = [r for r in rows if r["direction"] == "inbound" and r["status"] == "pending"]
    for r in waiting:
        key = f", key fingerprint {r['peerKeyFingerprint']}" if r.get("peerKeyFingerprint") else ""
        print(f"\n{r['nodeFqdn']} asks to pair{key}. If you recognise it, run `hubpool approve {r['id'][:8]}`"
              f" (or `hubpool reject {r['id'][:8]}`).")


def _peer_action(ident: str, action: str, url: str | None, method: str = "POST") -> Any:
    suffix = "" if action == "" else "/" + action
    return _call(url, method, P + "/peers/" + quote(ident, safe="") + suffix)


@app.command()
def approve(peer_id: str = typer.Argument(..., help="ID prefix, full ID or node name (see `hubpool peers`)."),
            yes: bool = YesOption, url: str | None = UrlOption) -> None:
    """Approve a pending inbound pairing request."""
    _confirm(f"Approve the pairing request {peer_id}? Approve only Hubs you recognise.", yes)
    row = _peer_action(peer_id, "approve", url)
    if row.get("callbackDelivered") is False:  # the approval stands, but the requester does not know
        err.print(row.get("message") or f"Approved {row['nodeFqdn']} here, but it could not be told.")
        raise typer.Exit(1)
    out.print(f"Approved {row['nodeFqdn']}: {row['status']}.")


@app.command()
def reject(peer_id: str = typer.Argument(..., help="ID prefix, full ID or node name."),
           yes: bool = YesOption, url: str | None = UrlOption) -> None:
    """Reject a pending inbound pairing request (the requester is told)."""
    _confirm(f"Reject the pairing request {peer_id}?", yes)
    _peer_action(peer_id, "reject", url)
    out.print(f"Rejected {peer_id}.")


@app.command()
def unpair(peer_id: str = typer.Argument(..., help="ID prefix, full ID or node name."),
           yes: bool = YesOption, url: str | None = UrlOption) -> None:
    """Remove a peer (or cancel a request this node sent); the other Hub is told."""
    _confirm(f"Unpair {peer_id}?", yes)
    data = _peer_action(peer_id, "", url, method="DELETE")
    if data.get("told") is False:  # done here; the other Hub still holds its half
        out.print(data.get("message") or f"Unpaired {peer_id} here, but the other Hub could not be told.")
    else:
        out.print(f"Unpaired {peer_id}; the other Hub was told.")


@app.command("peer-enable")
def peer_enable(peer_id: str = typer.Argument(..., help="ID prefix, full ID or node name."),
                url: str | None = UrlOption) -> None:
    """Exchange work with this peer again."""
    row = _peer_action(peer_id, "enable", url)
    out.print(f"{row['nodeFqdn']}: enabled.")


@app.command("peer-disable")
def peer_disable(peer_id: str = typer.Argument(..., help="ID prefix, full ID or node name."),
                 url: str | None = UrlOption) -> None:
    """Stop exchanging work with this peer, keeping the pairing (instantly reversible)."""
    row = _peer_action(peer_id, "disable", url)
    out.print(f"{row['nodeFqdn']}: disabled (still paired).")


@app.command("rotate-identity")
def rotate_identity(yes: bool = YesOption, url: str | None = UrlOption) -> None:
    """Mint a new keypair (same UUID) and unpair every peer, telling each one first."""
    _confirm("Rotate this node's key? Every peer is unpaired and must pair again.", yes)
    data = _call(url, "POST", P + "/identity/rotate")
    out.print(f"New key fingerprint {data['publicKeyFingerprint']}; unpaired {len(data['unpaired'])} peer(s).")
    if data["unreachable"]:
        out.print("Could not tell: " + ", ".join(data["unreachable"]) + " — unpair this node there by hand.")
