"""A Jepsen-style history: every client operation, and its reconciliation with the routing logs.

Each operation is recorded at invoke and completed as exactly one of

    ok             headers 200 and the answer's final frame arrived
    fail           an answer under an error status, read whole; or no headers at all ("lost")
    indeterminate  headers arrived and the stream was cut before its final frame, or the client
                   hung up on purpose (``abandoned``)

``reconcile`` then checks every node's routing log (the operator route, read whole) against
the history by X-Hub-Pool-Request-Id: each operation has exactly one outbound row on the node
it entered, no outbound row exists that no client sent, no id appears twice, the outcomes
agree, and every inbound row shares an id with its sender's outbound row (and the reverse for
every forward the serving node logged).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

OK, FAIL, INDETERMINATE = "ok", "fail", "indeterminate"


@dataclass
class Op:
    """One client operation."""

    index: int
    entry: str  # the node name the client called
    route: str
    invoked: float  # monotonic
    wall: float
    completed: float | None = None
    headers_at: float | None = None
    status: int | None = None
    rid: str | None = None
    served_by: str | None = None
    upstream_status: int | None = None  # X-Hub-Pool-Upstream-Status: what the engine said under op.status
    outcome: str | None = None  # ok | fail | indeterminate
    tokens: int = 0
    final: bool = False
    frames_after_final: int = 0
    abandoned: bool = False  # the client hung up on purpose
    error: str | None = None

    def brief(self) -> str:
        return (f"[#{self.index} {self.entry}{self.route} rid={self.rid} {self.outcome} status={self.status} "
                f"served_by={self.served_by} tokens={self.tokens} final={self.final} error={self.error}]")


class History:
    """Thread-safe record of client operations."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self._lock = threading.Lock()

    def invoke(self, entry: str, route: str) -> Op:
        with self._lock:
            op = Op(len(self.ops), entry, route, time.monotonic(), time.time())
            self.ops.append(op)
        return op

    @staticmethod
    def complete(op: Op) -> None:
        """Settle ``op``'s outcome from what the client saw (call once, when it ends)."""
        op.completed = time.monotonic()
        if op.status is None:
            op.outcome = FAIL  # never got headers: lost unless the caller expected it
        elif op.abandoned:
            op.outcome = INDETERMINATE
        elif op.status == 200 and op.final and not op.error:
            op.outcome = OK
        elif op.status == 200:
            op.outcome = INDETERMINATE  # headers then a cut: the request may have run
        else:
            op.outcome = FAIL

    def lost(self) -> list[Op]:
        """Operations that never received headers."""
        return [op for op in self.ops if op.status is None]

    def dump(self) -> list[dict[str, Any]]:
        return [asdict(op) for op in self.ops]


# -- the client side of one streamed operation ------------------------------------------------

def read_stream(response: httpx.Response, op: Op, stop_after_tokens: int | None = None) -> None:
    """Read a streamed answer into ``op``: content frames, and the dialect's final frame
    (native ``done: true``; OpenAI a finish_reason or [DONE]); anything after it is counted.
    ``stop_after_tokens`` hangs up after that many content frames (``op.abandoned``)."""
    closed = False
    native = not op.route.startswith("/v1/")
    for line in response.iter_lines():
        line = line.strip()
        if not line:
            continue
        if closed:
            op.frames_after_final += 1
        if native:
            frame = json.loads(line)
            if frame.get("done") is True:
                op.final = closed = True
            elif (frame.get("message") or {}).get("content") or frame.get("response"):
                op.tokens += 1
        elif line.startswith("data:"):
            data = line[5:].strip()
            if data == "[DONE]":
                op.final = closed = True
                continue
            frame = json.loads(data)
            for choice in frame.get("choices") or []:
                if (choice.get("delta") or {}).get("content") or choice.get("text"):
                    op.tokens += 1
                if choice.get("finish_reason"):
                    op.final = True
        if stop_after_tokens is not None and op.tokens >= stop_after_tokens and not op.final:
            op.abandoned = True
            return


def run_op(client: httpx.Client, history: History, entry: str, url: str, route: str, body: dict,
           stop_after_tokens: int | None = None) -> Op:
    """One streamed request through ``client``, recorded in ``history``."""
    op = history.invoke(entry, route)
    try:
        with client.stream("POST", url + route, json=body) as r:
            op.headers_at = time.monotonic()
            op.status = r.status_code
            op.rid = r.headers.get("x-hub-pool-request-id")
            op.served_by = r.headers.get("x-hub-pool-served-by")
            upstream = r.headers.get("x-hub-pool-upstream-status")
            op.upstream_status = int(upstream) if upstream and upstream.isdigit() else None
            if r.status_code != 200:
                op.error = r.read().decode(errors="replace")[:300]
            else:
                read_stream(r, op, stop_after_tokens)
    except (httpx.HTTPError, ValueError) as exc:
        op.error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        History.complete(op)
    return op


# -- reconciliation ----------------------------------------------------------------------------

@dataclass
class Reconciliation:
    problems: list[str] = field(default_factory=list)
    matched: int = 0
    inbound_checked: int = 0
    by_outcome: dict[str, int] = field(default_factory=dict)

    def ok(self) -> bool:
        return not self.problems


def reconcile(history: History, logs: dict[str, list[dict[str, Any]]], fqdns: dict[str, str],
              ignore: set[str] = frozenset(), complete_logs: set[str] | None = None) -> Reconciliation:
    """Reconcile ``history`` with ``logs`` (node name -> every routing-log row it holds).

    ``fqdns`` maps node name -> FQDN (the routing log names peers by FQDN); ``ignore`` holds
    request ids the test sent outside the history (warm-ups); ``complete_logs`` names the nodes
    whose log covers the whole run (a node that restarted lost its in-memory log, so only the
    rows it has are checked). Returns every disagreement, never stopping at the first.
    """
    out = Reconciliation()
    complete_logs = set(logs) if complete_logs is None else complete_logs
    name_of = {v: k for k, v in fqdns.items()}
    outbound: dict[str, dict[str, dict]] = {n: {} for n in logs}
    inbound: dict[str, dict[str, dict]] = {n: {} for n in logs}
    for node, rows in logs.items():
        seen: set[str] = set()
        for row in rows:
            if row["id"] in seen:
                out.problems.append(f"{node}: request id {row['id']} has two rows")
            seen.add(row["id"])
            (outbound if row["direction"] == "outbound" else inbound)[node][row["id"]] = row
            if row["outcome"] == "pending":
                out.problems.append(f"{node}: row still pending after the run: {row}")
    owners: dict[str, list[str]] = {}
    for node, rows in outbound.items():
        for rid in rows:
            owners.setdefault(rid, []).append(node)
    out.problems += [f"request id {rid} has outbound rows on {nodes}" for rid, nodes in owners.items() if len(nodes) > 1]

    ops_by_rid: dict[str, Op] = {}
    for op in history.ops:
        out.by_outcome[op.outcome or "?"] = out.by_outcome.get(op.outcome or "?", 0) + 1
        if op.rid is None:
            out.problems.append(f"lost before headers: {op.brief()}")
            continue
        if op.rid in ops_by_rid:
            out.problems.append(f"two client operations got the same request id: {op.brief()}")
        ops_by_rid[op.rid] = op
        row = outbound.get(op.entry, {}).get(op.rid)
        if row is None:
            out.problems.append(f"{op.entry}: no outbound row for {op.brief()}")
            continue
        out.matched += 1
        why = _disagreement(op, row)
        if why:
            out.problems.append(f"{op.entry}: {why}: {op.brief()} / row {row}")
    for node, rows in outbound.items():
        for rid, row in rows.items():
            if rid not in ops_by_rid and rid not in ignore:
                out.problems.append(f"{node}: outbound row no client sent: {row}")

    # inbound rows share the id with their sender's outbound row, whose attempts name this node
    for node, rows in inbound.items():
        for rid, row in rows.items():
            if rid in ignore:
                continue
            sender = name_of.get(row["node"])
            sent = outbound.get(sender, {}).get(rid) if sender else None
            out.inbound_checked += 1
            if sent is None:
                out.problems.append(f"{node}: inbound row whose sender {row['node']} has no outbound row: {row}")
                continue
            tried = {sent["node"], *sent["failedOverFrom"], *(a["node"] for a in sent["attempts"])}
            if fqdns[node] not in tried:
                out.problems.append(f"{node}: inbound row for a request its sender never sent here: {row} / {sent}")
            # served here, yet the sender received an error status from here: the two disagree (a
            # pass-over for a deadline or a transport fault can follow a leaf's "served": the
            # network, not the leaf, failed)
            refused = [a["status"] for a in sent["attempts"] if a["node"] == fqdns[node] and a.get("status") is not None]
            # the candidate a walk ran out on is in no attempt (it was passed over for nothing):
            # the row names it, and its reason carries the status it gave
            if sent["node"] == fqdns[node] and sent["status"] == 502 and str(sent.get("reason")).startswith("HTTP "):
                refused.append(sent.get("reason"))
            if row["outcome"] == "served" and refused:
                out.problems.append(f"{node}: served {rid} but its sender got {refused[0]} from here: {sent}")
    # every answer a peer served left an inbound row there under the same id
    for rid, op in ops_by_rid.items():
        if op.outcome == OK and op.served_by not in (None, "local"):
            server = name_of.get(op.served_by)
            if server in complete_logs:
                row = inbound.get(server, {}).get(rid)
                if row is None or (row["outcome"], row["node"]) != ("served", fqdns[op.entry]):
                    out.problems.append(f"{server}: inbound row for {op.brief()} is {row}")
    return out


def _disagreement(op: Op, row: dict) -> str | None:
    """Why the client's view of ``op`` and its outbound row disagree, or None."""
    node = row["node"]
    served_by = "local" if node == "local" else node
    if op.outcome == OK:
        if (row["outcome"], row["status"]) != ("served", 200):
            return f"client got a whole answer, row says {row['outcome']} {row['status']}"
        if op.served_by != served_by:
            return f"client was told {op.served_by}, row names {node}"
        if row["clientClosed"]:
            return "clientClosed on an answer read to the end"
        return None
    if op.outcome == INDETERMINATE and op.abandoned:
        if not row["clientClosed"]:
            return "the client hung up, the row does not say clientClosed"
        return None
    if op.outcome == INDETERMINATE:
        sig = (row["requestError"] or {}).get("signature")
        if (row["outcome"], sig) != ("failed", "truncated-upstream"):
            return f"cut stream, row says {row['outcome']} ({sig})"
        if op.served_by != served_by:
            return f"cut stream from {op.served_by}, row names {node}"
        if row["clientClosed"]:
            return "clientClosed on a stream the upstream cut"
        return None
    if op.outcome == FAIL and op.status is not None:
        # a verdict goes to the app as 400 with the engine's 500 in X-Hub-Pool-Upstream-Status;
        # the row keeps the engine's status
        if row["outcome"] != "failed" or row["status"] != (op.upstream_status or op.status):
            return f"client got {op.status} (upstream {op.upstream_status}), row says {row['outcome']} {row['status']}"
    return None


def read_log(url: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    """Every row of a node's routing log (the operator route, read whole)."""
    with httpx.Client(base_url=url, timeout=20, trust_env=False, headers=headers) as c:
        r = c.get("/api/inference/pool/routing-log", params={"limit": 10000})
    r.raise_for_status()
    return r.json()["entries"]


def wait_settled(read: Any, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Read a log until no row is pending (a row settles a moment after its stream ends)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = read()
        if not any(r["outcome"] == "pending" for r in rows) or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)
