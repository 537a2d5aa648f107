"""Shared text formatting for the CLI: times, fixed-width tables, the routing-log counts
line and the peers table that `status` and `peers` both print (protocol.md §5c)."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

#: consecutive failed polls that mark a peer unreachable (hubpool_core.peering.health, spec: Recovery)
UNREACHABLE_THRESHOLD = 3

PEER_COLUMNS = (("ID", 8), ("NODE", 34), ("DIR", 4), ("STATUS", 16), ("LAST SEEN", 20), ("QUEUE", 5),
                ("CONTEXT", 7), ("ENGINES", 0))


def printable(text: str) -> str:
    """``text`` safe to print on the operator's terminal: every control character (C0, DEL,
    C1: the escape sequences a terminal obeys), format character (bidi overrides, zero-width
    marks) and line or paragraph separator is shown as ``\\xNN`` / ``\\uNNNN``. A model
    name is whatever a caller sent, so it must never drive the terminal that shows it."""
    if text.isprintable():  # the common case: nothing to look at character by character
        return text
    out = []
    for c in text:
        if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp"):
            out.append(f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return "".join(out)


#: what a spreadsheet reads as the start of a formula (OWASP's CSV injection list)
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """One CSV cell: text printable (see :func:`printable`), and a leading ``= + - @`` (tab,
    carriage return) neutralised with a ``'`` so a spreadsheet shows it instead of running it.
    Numbers are left as they are."""
    if not isinstance(value, str):
        return value
    text = printable(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def when(value: str | None, missing: str = "-") -> str:
    """An ISO-8601 time as ``YYYY-MM-DD HH:MM:SSZ`` (UTC)."""
    if not value:
        return missing
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return value
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def flag(value: Any) -> str:
    """A setting as the wire spells it (true, false, null)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"


def table(columns: Sequence[tuple[str, int]], rows: Iterable[Sequence[str]]) -> list[str]:
    """Fixed-width columns, one space apart. A width is a minimum: a longer cell widens its
    column for every row, so the table stays aligned. The last column is not padded."""
    rows = [list(r) for r in rows]
    widths = [max([w, len(h)] + [len(r[i]) for r in rows]) for i, (h, w) in enumerate(columns)]
    lines = []
    for cells in [[h for h, _ in columns]] + rows:
        parts = [c.ljust(widths[i]) if i < len(cells) - 1 else c for i, c in enumerate(cells)]
        lines.append(" ".join(parts).rstrip())
    return lines


def labelled(label: str, text: str, indent: str = "") -> str:
    return f"{indent}{label:<14}{text}"


def override_lines(status: dict[str, Any], keys: list[str]) -> list[str]:
    """What to say when a setting just written is held by the node's environment instead (as
    `hubpool enable` says of a kill switch): one sentence per key, then how to let it apply."""
    held = status.get("environmentOverrides") or {}
    local = status.get("localNode") or {}
    if "poolMaxPromptTokens" not in held and local.get("maxPromptTokensSetBy") == "env":  # a node before the field
        held = {**held, "poolMaxPromptTokens": {"variable": "HUB_POOL_MAX_PROMPT_TOKENS",
                                                "value": local.get("maxPromptTokens")}}
    lines = []
    for key in keys:
        if key in held:
            var, value = held[key]["variable"], held[key]["value"]
            shown = ",".join(value) if isinstance(value, list) else flag(value)
            lines.append(f"warning: {var}={shown} in this node's environment overrides {key}: the new value is "
                         "saved, but nothing changed in what this node does.")
    if lines:
        lines.append("Remove that variable from the node's environment (its service's environment file) and "
                     "restart it; the setting then takes effect.")
    return lines


# -- routing-log summary ----------------------------------------------------------------

def counts_line(summary: dict[str, Any]) -> str:
    """``R/C recorded · S served · F failed (breakdown) · N failovers``."""
    failed = summary.get("failed", 0)
    parts = []
    for key, words in (("clientClosed", ("abandoned by the caller",) * 2),
                       ("requestErrors", ("refused as a bad request", "refused as bad requests")),
                       ("outputFaults", ("bad answer", "bad answers"))):
        n = summary.get(key) or 0
        if n:
            parts.append(f"{n} {words[0] if n == 1 else words[1]}")
    failed_text = f"{failed} failed" + (f" ({', '.join(parts)})" if parts else "")
    pieces = [f"{summary.get('recorded', 0)}/{summary.get('capacity', '?')} recorded",
              f"{summary.get('served', 0)} served", failed_text]
    if summary.get("pending"):
        pieces.append(f"{summary['pending']} pending")
    pieces.append(plural(summary.get("failovers", 0), "failover"))
    return " · ".join(pieces)


# -- peers --------------------------------------------------------------------------------

def capabilities(peer: dict[str, Any]) -> dict[str, Any] | None:
    caps = peer.get("lastCapabilities")
    return caps if isinstance(caps, dict) else None


def peer_status(peer: dict[str, Any]) -> str:
    """``connected``, ``connected/off``, ``connected 1/3`` while failing polls, ``identity
    changed`` or ``credentials refused`` when the peer refuses this node."""
    kind = (peer.get("probeFailure") or {}).get("kind")
    if kind == "identity_changed":
        text = "identity changed"
    elif kind == "unauthorized":
        text = "credentials refused"
    elif kind == "own_identity":
        text = "cannot sign (own key)"
    elif kind == "signed_required":
        text = "unsigned: refused"  # poolRequireSignedPeers: back only by the operator's hand
    else:
        text = str(peer.get("status") or "?")
    if peer.get("enabled") is False:
        text += "/off"
    strikes = peer.get("consecutiveFailures") or 0
    if peer.get("status") == "connected" and strikes and kind != "identity_changed":
        text += f" {min(strikes, UNREACHABLE_THRESHOLD)}/{UNREACHABLE_THRESHOLD}"
    return text


def peer_context(peer: dict[str, Any]) -> str:
    """The context cap the peer states (maxNumCtx): a number, ``none``, or ``?`` when this
    node holds no capabilities snapshot for it."""
    cap = peer.get("maxNumCtx")
    caps = capabilities(peer)
    if cap is None and caps is not None:
        cap = caps.get("maxNumCtx")
    if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0:
        return str(cap)
    return "none" if caps is not None else "?"


def peer_engines(peer: dict[str, Any]) -> str:
    """``vllm(2) ollama(✗)`` from the last capabilities snapshot."""
    caps = capabilities(peer)
    if caps is None:
        return "-"
    if caps.get("acceptingWork") is False:
        return "not accepting work"
    out = []
    for b in caps.get("backends") or []:
        if not isinstance(b, dict):
            continue
        models = m if isinstance(m := b.get("modelsLoaded"), list) else []
        out.append(f"{b.get('type', '?')}({len(models) if b.get('healthy') else '✗'})")
    return " ".join(out) or "none"


def peer_queue(peer: dict[str, Any]) -> str:
    n = peer.get("inFlightRequests")
    return "?" if n is None else str(n)


def peer_cells(peer: dict[str, Any]) -> list[str]:
    return [str(peer.get("id", ""))[:8], str(peer.get("nodeFqdn") or "-"),
            "in" if peer.get("direction") == "inbound" else "out", peer_status(peer),
            when(peer.get("lastSeenAt"), "never"), peer_queue(peer), peer_context(peer), peer_engines(peer)]


#: the GPU pressure band (0-3) in words: the thresholds are 40/70/85 % busy (docs/gpu-pressure.md)
BAND_WORDS = ("idle", "moderate", "busy", "saturated")


def gpu_band(value: Any) -> str:
    """``busy (band 2 of 3)``, or ``not reported`` — never an idle machine — when absent."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(BAND_WORDS):
        return f"{BAND_WORDS[value]} (band {value} of {len(BAND_WORDS) - 1})"
    return "not reported"


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover - the loop returns


def containers_text(value: Any) -> str:
    """``6 running, 2 stopped · CPU 91% · memory 5.0 GiB``, or ``not reported`` when the node
    publishes none (or it is stale): absent is never drawn as zero."""
    if not isinstance(value, dict):
        return "not reported"
    return (f"{value.get('running')} running, {value.get('stopped')} stopped · CPU {value.get('cpuPercent', 0):.0f}%"
            f" · memory {size(float(value.get('memoryBytes') or 0))}")


def load_lines(local: dict[str, Any] | None, peers: list[dict[str, Any]]) -> list[str]:
    """The ``Load`` section: each node's GPU pressure band and container rollup, as the node
    publishes them (a peer's band floored by this node's own forwards to it)."""
    rows = []
    if local is not None:
        rows.append(("this node", local.get("gpuPressure"), local.get("containers")))
    rows += [(str(p.get("nodeFqdn") or "?"), p.get("gpuPressure"), p.get("containers")) for p in peers]
    if not rows:
        return []
    width = max(len(r[0]) for r in rows)
    return ["Load"] + [f"  {name:<{width}}  GPU {gpu_band(band)} · containers {containers_text(c)}"
                       for name, band, c in rows]


def peers_table(peers: list[dict[str, Any]], extra: Sequence[tuple[str, int]] = (),
                extra_cells: Any = None) -> list[str]:
    columns = list(PEER_COLUMNS) + list(extra)
    rows = [peer_cells(p) + (list(extra_cells(p)) if extra_cells else []) for p in peers]
    return table(columns, rows)
