"""`hubpool log`: recent routing decisions with their ↳ annotations (protocol.md §5a, §5c;
spec: Client hang-ups, A request no node can serve, A 200 that is not an answer)."""

# no `from __future__ import annotations`: it binds the name `annotations`, which the import
# of telemetry's annotations() below would shadow
import csv
import json
import sys
from typing import Any
from urllib.parse import urlencode

import typer

from hubpool_core.cli.commands import UrlOption, _fail, app, whole_number
from hubpool_core.cli.format import counts_line, csv_cell, labelled, printable, table, when
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

    model = str(e.get("model") or "-")
    if e.get("requestedModel"):  # an alias or auto: both names, the one asked first
        model = f"{e['requestedModel']}→{model}"
    # every cell as the terminal may show it: a model name is whatever a caller sent
    return [printable(c) for c in (
        when(e.get("at")), "in" if e.get("direction") == "inbound" else "out", model,
        str(e.get("node") or "-"), f"{e.get('attempt', 0)}/{e.get('candidates', 0)}", num(e.get("durationMs")),
        num(e.get("totalMs")), outcome(e))]


#: the columns --csv writes, in order (the whole row is in --json)
CSV_FIELDS = ("at", "id", "direction", "path", "model", "node", "backend", "attempt", "candidates", "outcome",
              "status", "durationMs", "totalMs", "reason", "failedOverFrom", "clientClosed", "requestedModel")
HISTORY_MAX_LIMIT = 10_000


def write_csv(entries: list[dict[str, Any]]) -> None:
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(CSV_FIELDS)
    for e in entries:
        out.writerow([csv_cell(";".join(map(str, v)) if isinstance(v := e.get(k), list) else ("" if v is None else v))
                      for k in CSV_FIELDS])


@app.command("log")
def log_cmd(
    limit: int = typer.Option(20, "--limit", parser=whole_number,
                              help="How many decisions to show: 1 to 200 from the ring, up to 10000 from the history."),
    since: str | None = typer.Option(None, "--since", help="Read the persisted history from this long ago (90s, "
                                                           "30m, 2h, 7d) or an ISO 8601 time."),
    model: str | None = typer.Option(None, "--model", help="Only this model (reads the history)."),
    node: str | None = typer.Option(None, "--node", help="Only rows that name this node: its tailnet name, short "
                                                         "name, or local (reads the history)."),
    outcome: str | None = typer.Option(None, "--outcome", help="served or failed (reads the history)."),
    url: str | None = UrlOption,
    as_json: bool = typer.Option(False, "--json", help="Print the node's answer as JSON instead of text."),
    as_csv: bool = typer.Option(False, "--csv", help="Print one CSV line per decision (with a header)."),
) -> None:
    """Show routing decisions, newest first, with a ↳ line for each hang-up, refused request,
    pin, failover and failure. Without filters: the in-memory ring. With --since, --model,
    --node or --outcome: the persisted routing history (HUB_POOL_HISTORY, docs/history.md)."""
    if as_json and as_csv:
        _fail("--json and --csv are two formats: give one")
    history = any(v is not None for v in (since, model, node, outcome))
    if outcome is not None and outcome not in ("served", "failed"):
        _fail("--outcome must be served or failed")
    if not 1 <= limit <= (HISTORY_MAX_LIMIT if history else MAX_LIMIT):
        _fail(f"--limit must be a whole number from 1 to {HISTORY_MAX_LIMIT if history else MAX_LIMIT}")
    if history:
        query = {k: v for k, v in (("since", since), ("model", model), ("node", node), ("outcome", outcome),
                                   ("limit", str(limit))) if v is not None}
        data = _call(url, "GET", f"{P}/routing-history?{urlencode(query)}")
    else:
        data = _call(url, "GET", f"{P}/routing-log?limit={limit}")
    if as_json:
        print(json.dumps(data, indent=2))
        return
    if as_csv:
        write_csv(data.get("entries") or [])
        return
    if history:
        entries = data.get("entries") or []
        shown = f"{len(entries)} of {data.get('matched', len(entries))} matching"
        print(labelled("Routing history", shown))
        if not entries:
            print("\nNo routing decisions in the history match.")
            return
        _print_rows(entries)
        return
    summary = data.get("summary") or {}
    print(labelled("Routing log", counts_line(summary)))
    print(labelled("Last decision", when(summary.get("lastAt"), "none yet")))
    entries = data.get("entries") or []
    if not entries:
        print("\nNo routing decisions recorded since this node started.")
        return
    _print_rows(entries)


def _print_rows(entries: list[dict[str, Any]]) -> None:
    """The rows as a table, each followed by its ↳ notes."""
    print()
    lines = table(COLUMNS, [cells(e) for e in entries])
    print(lines[0])
    for e, line in zip(entries, lines[1:], strict=True):
        print(line)
        for note in annotations(e):
            print(f"  ↳ {printable(note)}")
