"""`hubpool log`: recent routing decisions with their ↳ annotations (protocol.md §5a, §5c;
spec: Client hang-ups, A request no node can serve, A 200 that is not an answer)."""

# no `from __future__ import annotations`: it binds the name `annotations`, which the import
# of telemetry's annotations() below would shadow
import json
from typing import Any

import typer

from hubpool_core.cli.commands import UrlOption, _fail, app
from hubpool_core.cli.format import counts_line, labelled, table, when
from hubpool_core.cli.pairing_commands import _call
from hubpool_core.telemetry.annotations import annotations

P = "/api/inference/pool"
MAX_LIMIT = 200
COLUMNS = (("TIME", 20), ("DIR", 4), ("MODEL", 20), ("NODE", 34), ("ATT", 5), ("MS", 7), ("TOTAL", 8),
           ("OUTCOME", 0))

def outcome(e: dict[str, Any]) -> str:
    if e.get("outcome") == "served":
        return f"✓ served {e.get('status') or '-'}"
    if e.get("outcome") == "pending":
        return "… pending"
    return f"✗ failed {e.get('status') or '-'}"


def cells(e: dict[str, Any]) -> list[str]:
    def num(v: Any) -> str:
        return "-" if v is None else str(v)

    return [when(e.get("at")), "in" if e.get("direction") == "inbound" else "out", e.get("model") or "-",
            e.get("node") or "-", f"{e.get('attempt', 0)}/{e.get('candidates', 0)}", num(e.get("durationMs")),
            num(e.get("totalMs")), outcome(e)]


@app.command("log")
def log_cmd(
    limit: int = typer.Option(20, "--limit", help="How many recent decisions to show, from 1 to 200."),
    url: str | None = UrlOption,
    as_json: bool = typer.Option(False, "--json", help="Print the node's routing-log answer as JSON instead "
                                                       "of text."),
) -> None:
    """Show recent routing decisions, newest first, with a ↳ line for each hang-up, refused
    request, pin, failover and failure."""
    if not 1 <= limit <= MAX_LIMIT:
        _fail(f"--limit must be a whole number from 1 to {MAX_LIMIT}")
    data = _call(url, "GET", f"{P}/routing-log?limit={limit}")
    if as_json:
        print(json.dumps(data, indent=2))
        return
    summary = data.get("summary") or {}
    print(labelled("Routing log", counts_line(summary)))
    print(labelled("Last decision", when(summary.get("lastAt"), "none yet")))
    entries = data.get("entries") or []
    if not entries:
        print("\nNo routing decisions recorded since this node started.")
        return
    print()
    lines = table(COLUMNS, [cells(e) for e in entries])
    print(lines[0])
    for e, line in zip(entries, lines[1:], strict=True):
        print(line)
        for note in annotations(e):
            print(f"  ↳ {note}")
