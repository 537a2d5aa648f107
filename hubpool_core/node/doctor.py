"""`hubpool doctor`: can this node pool, and will peers reach it. Each check has an ID, a
verdict (ready, warning, needs action) and the command that fixes it."""

from __future__ import annotations

import logging
from typing import Any

from hubpool_core.config import tailscale_serve_line

log = logging.getLogger("hubpool.doctor")

READY, WARNING, ACTION = "ready", "warning", "needs action"
_LEVELS = {"ok": READY, "warn": WARNING, "fail": ACTION}


def _check(check_id: str, title: str, verdict: str, detail: str, fix: str | None = None) -> dict[str, Any]:
    return {"id": check_id, "title": title, "verdict": verdict, "detail": detail, "fix": fix}


async def run_checks(node: Any) -> list[dict[str, Any]]:
    checks = []
    tailnet = await node.tailnet.status()
    name = await node.tailnet.self_fqdn()
    if not tailnet.connected:
        checks.append(_check("C1", "Tailnet name", ACTION, tailnet.error or "this node is not on a tailnet",
                             "run `tailscale up` on this machine (and turn on MagicDNS for the tailnet)"))
    elif not name:
        checks.append(_check("C1", "Tailnet name", ACTION, "Tailscale is connected but this node has no MagicDNS name",
                             "turn on MagicDNS in the Tailscale admin console (DNS), then run doctor again"))
    elif tailnet.online is False:
        checks.append(_check("C1", "Tailnet name", WARNING, f"{name}, but the Tailscale coordination server sees "
                             "this node offline: peers may not find it",
                             "check this machine's network, then `tailscale status`"))
    else:
        checks.append(_check("C1", "Tailnet name", READY, name))
    # the same mapping as the service's line: a wildcard address is served from loopback
    serve_fix = tailscale_serve_line(node.env.listen)
    if tailnet.serving is True:
        checks.append(_check("C2", "Published over Tailscale", READY, f"https://{name} fronts this node"))
    elif tailnet.serving is False:
        checks.append(_check("C2", "Published over Tailscale", ACTION,
                             (tailnet.serve_detail or "`tailscale serve` does not publish this node")
                             + "; peers dial https://<name>", serve_fix))
    else:
        checks.append(_check("C2", "Published over Tailscale", WARNING,
                             "cannot tell whether `tailscale serve` publishes this node; peers dial https://<name>",
                             serve_fix))
    checks.append(_certs_check(tailnet, name))
    directions = node.directions()
    if directions.master.enabled:
        checks.append(_check("P1", "Pooling switched on", READY, "pooling is on"))
    else:
        fix = ("remove HUB_POOL_USER_DISABLED from this node's environment and restart it"
               if directions.master.disabled_by == "env" else "hubpool enable")
        checks.append(_check("P1", "Pooling switched on", ACTION, directions.describe_master(), fix))
    backends = await node.local.read(0)
    down = [b for b in backends if not b.healthy]
    up = [b for b in backends if b.healthy]
    for b in down:
        env_var = b.engine.env_var
        # an engine left at its default URL that is not running is simply not installed here
        if b.engine.config.source == "default" and not b.snapshot.result.running:
            continue
        checks.append(_check("E1", f"Engine {b.engine.kind}", ACTION,
                             f"{b.engine.base_url}: {b.snapshot.result.error or 'not healthy'}",
                             f"check that {b.engine.kind} runs and answers at that address from where this node "
                             f"runs (firewall, bind address), or set {env_var}"))
    if up:
        checks.append(_check("E1", "Engines", READY, ", ".join(f"{b.engine.kind} ({len(b.snapshot.result.models)} "
                                                               f"models)" for b in up)))
    elif not any(c["id"] == "E1" for c in checks):
        checks.append(_check("E1", "Engines", WARNING, "no engine answers on this node; it can only forward work",
                             "set " + " or ".join(e.env_var for e in node.local.engines)))
    checks.append(_identity_check(node, name))
    refusing = []
    for row in node.peers.all():
        failure = node.health.failures.get(row.id)
        if failure and failure.kind in ("identity_changed", "unauthorized", "signed_required"):
            refusing.append((row.node_fqdn, failure))
    if refusing:
        for fqdn, failure in refusing:
            words = {"identity_changed": f"identity changed (HTTP {failure.http_status})",
                     "unauthorized": f"credentials refused (HTTP {failure.http_status})",
                     "signed_required": "paired with bearer tokens only, refused here under poolRequireSignedPeers; "
                                        "it does not come back by itself"}[failure.kind]
            checks.append(_check("F1", f"Peer {fqdn}", ACTION, words, failure.as_json()["action"]))
    else:
        checks.append(_check("F1", "Peers accept this node", READY, "no peer refuses this node"))
    checks.append(_caps_check(node))
    if any(d.configured() for d in node.directories):
        await _ask_directories(node)
        directories = _directories_check(node)
        if directories is not None:
            checks.append(directories)
    checks.append(_clock_check(node))
    for check_id, fn in sorted(node.plugins.doctor_checks.items()):
        try:
            level, message = fn(node)
            checks.append(_check(check_id, check_id, _LEVELS.get(level, WARNING), message))
        except Exception as exc:  # noqa: BLE001 - a plugin's check failing is itself a warning
            checks.append(_check(check_id, check_id, WARNING, f"the check raised {type(exc).__name__}: {exc}"))
    return checks


#: the one recovery for a key that cannot be opened (spec "Failure modes")
ROTATE_FIX = ("hubpool rotate-identity (keeps this node's UUID, seals a new key under the current node.secret and "
              "unpairs every peer); then on each peer that still lists this node, hubpool unpair {name}, and pair "
              "again with a PIN")


def _identity_check(node: Any, name: str | None) -> dict[str, Any]:
    """I1: can this node sign? A key sealed under a lost node.secret never recovers by waiting."""
    identity = node.identity.get()
    if identity is None:
        return _check("I1", "Pool identity", ACTION,
                      node.identity.error or "this node's pool identity cannot be loaded",
                      f"check that the data directory ({node.env.data_dir}) and the database are readable by "
                      "this node, then run doctor again")
    if identity.signing_key is None:
        return _check("I1", "Pool identity", ACTION,
                      f"this node cannot sign: {node.identity.error or 'its private key cannot be opened'}",
                      ROTATE_FIX.format(name=name or "<this node>"))
    return _check("I1", "Pool identity", READY, f"key fingerprint {identity.fingerprint}")


async def _ask_directories(node: Any) -> None:
    """Ask each configured directory for the tailnet's members once, so D1 reports an API as it
    is now rather than as it was at the last discovery or pairing (a directory that cannot
    enumerate answers None at once)."""
    for directory in node.directories:
        if directory.configured():
            try:
                await directory.members()
            except Exception:  # noqa: BLE001 - members() raises nothing by contract; a bug shows in D1
                log.debug("directory %s raised from members()", directory.name, exc_info=True)


def _certs_check(tailnet: Any, name: str | None) -> dict[str, Any]:
    """C3: peers dial https://<name>, which needs the tailnet to issue this node a certificate."""
    title, fix = "HTTPS certificates", "turn on HTTPS Certificates in the Tailscale admin console (DNS)"
    if not tailnet.connected or not name:
        return _check("C3", title, ACTION, "without a tailnet name there is no certificate to issue",
                      "fix C1 first")
    if tailnet.https_certs is True:
        return _check("C3", title, READY, f"the tailnet issues a certificate for {name}")
    if tailnet.https_certs is False:
        return _check("C3", title, ACTION, f"the tailnet issues no certificate for {name} (HTTPS is off for the "
                      "tailnet), so peers cannot reach https://<name>", fix)
    return _check("C3", title, WARNING, "cannot tell whether HTTPS certificates are on for the tailnet; peers "
                  "dial https://<name>", fix)


def _directories_check(node: Any) -> dict[str, Any] | None:
    """D1: a configured directory that failed (an unreachable Admin API) degrades pairing's
    membership check to the MagicDNS suffix; the operator sees it here and in the log."""
    problems = []
    for directory in node.directories:
        if not directory.configured():
            continue
        try:
            problem = directory.problem()
        except Exception as exc:  # noqa: BLE001 - a plugin bug is itself a problem to show
            problem = f"{type(exc).__name__}: {exc}"
        if problem:
            problems.append(f"{directory.name}: {problem}")
    if problems:
        return _check("D1", "Directories", WARNING, "; ".join(problems)
                      + " (discovery lists nothing from it and pairing checks only the tailnet's MagicDNS suffix)",
                      "check this machine reaches the API and the credential in the environment, then run doctor "
                      "again")
    return None


def _caps_check(node: Any) -> dict[str, Any]:
    own = node.settings.current.maxNumCtx
    caps: dict[str, int | None] = {"this node": own}
    for row in node.peers.all():
        if row.status != "connected" or not isinstance(row.last_capabilities, dict):
            continue
        value = row.last_capabilities.get("maxNumCtx")
        caps[row.node_fqdn] = value if isinstance(value, int) and value > 0 else None
    capped = {n: c for n, c in caps.items() if c is not None}
    if not capped:
        return _check("F2", "Context caps", READY, "no node states a context cap")
    uncapped = [n for n, c in caps.items() if c is None]
    if uncapped:
        return _check("F2", "Context caps", WARNING,
                      f"{', '.join(uncapped)} state no cap among capped nodes: they read as 'takes any window' and "
                      "collect exactly the windows their engine may not run",
                      "hubpool context-cap <the engine's context length> on each of them")
    if len(set(capped.values())) > 1:
        return _check("F2", "Context caps", WARNING,
                      "caps disagree: " + ", ".join(f"{n}={c}" for n, c in capped.items())
                      + " (a low-capped node stops taking large windows while passing every health check)")
    return _check("F2", "Context caps", READY, f"every node caps at {next(iter(capped.values()))}")


def _clock_check(node: Any) -> dict[str, Any]:
    from datetime import datetime

    from hubpool_core.peering.health import CLOCK_WARN_MS

    # each peer states its clock on every answer, refusals included (peering/health.py): the
    # only reading left once the clocks are too far apart for a signature to pass
    clocks = {r.id: r.node_fqdn for r in node.peers.all() if r.id in node.health.clocks}
    if clocks:
        worst_id = max(clocks, key=lambda pid: abs(node.health.clocks[pid]))
        skew = node.health.clocks[worst_id]
        if abs(skew) > CLOCK_WARN_MS:
            return _check("T1", "Clocks", ACTION, node.health.clock_verdict(worst_id) or "",
                          "enable NTP (timedatectl set-ntp true) on the machine named")
        return _check("T1", "Clocks", READY, f"peers within {abs(skew) / 1000:.0f} s")
    worst = None
    for row in node.peers.all():
        caps = row.last_capabilities if isinstance(row.last_capabilities, dict) else {}
        stamp, seen = caps.get("updatedAt"), row.last_seen_at
        if not isinstance(stamp, str) or seen is None:
            continue
        try:
            theirs = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        except ValueError:
            continue
        from hubpool_core.peering.peers import aware

        skew = abs((theirs - aware(seen)).total_seconds())
        if worst is None or skew > worst[1]:
            worst = (row.node_fqdn, skew)
    if worst is None:
        return _check("T1", "Clocks", READY, "no peer to compare with")
    if worst[1] > 240:
        return _check("T1", "Clocks", ACTION, f"{worst[0]} is {worst[1]:.0f} s away from this node's clock; signed "
                      "requests allow 300 s", "enable NTP (timedatectl set-ntp true) on both machines")
    return _check("T1", "Clocks", READY, f"peers within {worst[1]:.0f} s")
