"""Chaos (issue 4, "Must show"): under 32 concurrent streamed requests across three nodes for
30 s while one peer is killed and restarted every 10 s, every request that had not received
headers when its node died is served by another node, and the routing log accounts for
every request.

The three nodes are separate `hubpool serve` processes (tests/process_harness.py) so the
victim, hub-b, is SIGKILLed for real and started again on the same port with the same data
directory. Apps talk to their own nodes, hub-a and hub-c, whose default pin sends work to
hub-b while it is up: work reaches hub-b only as a peer forward. Each node has its own
simulated Ollama holding the same model.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import asdict, dataclass

import httpx
import pytest
from harness import RunningNode, fqdn
from history import read_stream  # the same frame reading the fault suite reconciles with
from process_harness import make_process_pool, pair, wait_connected
from raw_http import RawHttpServer, read_request, send_json

from hubpool_sim import SimConfig, SimModel, run_in_thread

MODEL = "llama3.2:3b"
NAMES = ["hub-a", "hub-b", "hub-c"]
VICTIM = "hub-b"
ENTRIES = ("hub-a", "hub-c")
WORKERS = 32
LOAD_S = 30.0
FIRST_KILL_S, KILL_EVERY_S, DOWN_S = 5.0, 10.0, 1.5
TOKENS, MS_PER_TOKEN = 20, 20
#: ~50 prompt tokens at 400 tokens/s: ~125 ms before an engine sends headers, so a kill finds
#: forwards in flight that have not received headers yet (the case the issue names)
PREFILL_TPS = 400
PADDING = "Answer briefly. " * 12
CLIENT_TIMEOUT_S = 20.0
MAX_OPS_PER_WORKER = 1000  # a bound, far above what 30 s of half-second streams can reach
ROUTES = ("/api/chat", "/v1/chat/completions")
P = "/api/inference/pool"
#: the victim restarts from a warm spare (process_harness.WARM_LAUNCHER): a cold interpreter
#: spends 5-10 s importing on a saturated two-core machine, which would leave the victim down
#: for most of each 10 s cycle; False restarts it cold
WARM_RESTARTS = True


@dataclass
class Operation:
    worker: int
    seq: int
    entry: str
    route: str
    start_wall: float
    start: float
    end: float | None = None
    headers_at: float | None = None
    status: int | None = None
    rid: str | None = None
    served_by: str | None = None
    tokens: int = 0
    final: bool = False
    frames_after_final: int = 0
    error: str | None = None

    def brief(self) -> str:
        return (f"[w{self.worker}#{self.seq} {self.entry}{self.route} rid={self.rid} status={self.status} "
                f"served_by={self.served_by} tokens={self.tokens} final={self.final} "
                f"t={self.start:.2f}..{self.end if self.end is None else round(self.end, 2)} error={self.error}]")


def request_body(route: str, worker: int, seq: int) -> dict:
    messages = [{"role": "user", "content": f"worker {worker} turn {seq}. {PADDING}"}]
    return {"model": MODEL, "messages": messages, "stream": True}


def client_worker(worker: int, urls: dict[str, str], ops: list[Operation], rr: itertools.count,
                  stop_at: float) -> None:
    with httpx.Client(timeout=CLIENT_TIMEOUT_S, trust_env=False) as client:
        for seq in range(MAX_OPS_PER_WORKER):
            if time.monotonic() >= stop_at:
                return
            entry = ENTRIES[next(rr) % len(ENTRIES)]
            route = ROUTES[(worker + seq) % len(ROUTES)]
            op = Operation(worker, seq, entry, route, time.time(), time.monotonic())
            ops.append(op)
            try:
                with client.stream("POST", urls[entry] + route, json=request_body(route, worker, seq)) as r:
                    op.headers_at = time.monotonic()
                    op.status = r.status_code
                    op.rid = r.headers.get("x-hub-pool-request-id")
                    op.served_by = r.headers.get("x-hub-pool-served-by")
                    if r.status_code != 200:
                        op.error = r.read().decode(errors="replace")[:300]
                    else:
                        read_stream(r, op)
            except (httpx.HTTPError, ValueError) as exc:
                op.error = f"{type(exc).__name__}: {exc}"[:300]
            finally:
                op.end = time.monotonic()


def chaos(victim, t0: float, stop_at: float, events: list[dict], errors: list[str]) -> None:
    """Every KILL_EVERY_S: read the victim's routing log (its rows die with it), SIGKILL it,
    wait DOWN_S, start it again."""
    try:
        for k in itertools.count():
            at = t0 + FIRST_KILL_S + k * KILL_EVERY_S
            if at >= stop_at - 2 or k >= 5:
                return
            time.sleep(max(0.0, at - time.monotonic()))
            asked = time.monotonic()
            try:
                snapshot = routing_log(victim)
            except (httpx.HTTPError, AssertionError) as exc:
                snapshot = None
                errors.append(f"the victim's routing log before kill {k + 1} could not be read: {exc}")
            killed = time.monotonic()
            victim.kill()
            time.sleep(DOWN_S)
            victim.start(ready_timeout=20)
            events.append({"asked": asked, "killed": killed, "up": time.monotonic(), "log": snapshot})
    except Exception as exc:  # noqa: BLE001 - reported by the test
        errors.append(f"{type(exc).__name__}: {exc}")


# -- the answer that was whole when its connection died ------------------------------------

class FinishThenCloseEngine(RawHttpServer):
    """A raw-socket Ollama whose streamed chat sends every token and the closing frame
    (`done: true`; on /v1/chat/completions the finish_reason chunk, not [DONE]), then (0.3 s
    later) closes the connection without the chunked terminator: what the pool sees when a
    peer dies between relaying an answer's last frame and ending the HTTP body. It answers
    /api/tags so the node's probe finds the model. Loopback, one thread, stopped by close()."""

    def __init__(self, model: str):
        self.model = model
        super().__init__()

    def handle(self, conn: socket.socket, serial: int) -> None:
        got = read_request(conn)
        if got is None:
            return
        path = got[0].decode("latin-1")
        if path == "/api/tags":
            send_json(conn, {"models": [{"name": self.model, "model": self.model}]}, close=True)
            return
        if path == "/api/chat":
            frames = [json.dumps({"model": self.model, "message": {"role": "assistant", "content": f"tok{i} "},
                                  "done": False}).encode() + b"\n" for i in range(3)]
            frames.append(json.dumps({"model": self.model, "message": {"role": "assistant", "content": ""},
                                      "done": True, "done_reason": "stop", "eval_count": 3}).encode() + b"\n")
            ctype = b"application/x-ndjson"
        else:  # /v1/chat/completions: the finish_reason chunk, and the connection closes before [DONE]
            chunk = {"id": "c", "object": "chat.completion.chunk", "model": self.model}
            frames = [b"data: " + json.dumps({**chunk, "choices": [{"index": 0, "delta": {"content": f"tok{i} "},
                                                                     "finish_reason": None}]}).encode() + b"\n\n"
                      for i in range(3)]
            frames.append(b"data: " + json.dumps({**chunk, "choices": [{"index": 0, "delta": {},
                                                                        "finish_reason": "stop"}]}).encode() + b"\n\n")
            ctype = b"text/event-stream"
        out = b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n\r\n" % ctype
        for line in frames:
            out += b"%x\r\n%s\r\n" % (len(line), line)
        conn.sendall(out)  # ... and no b"0\r\n\r\n": the connection closes after a moment
        # (the moment matters: bytes that arrive together with the close are never read by the
        # relay at all, since aiohttp's StreamReader raises the connection error before its buffer)
        time.sleep(0.3)
        conn.shutdown(socket.SHUT_WR)


def final_frame_then_cut(root, route: str) -> tuple[Operation, dict]:
    """A streamed chat through a node whose engine ends as FinishThenCloseEngine does: what
    the client read, and the node's routing-log row for it."""
    engine = FinishThenCloseEngine(MODEL)
    try:
        with RunningNode(root / "finish-then-close", {"OLLAMA_URL": engine.url}) as node:
            op = Operation(0, 0, "finish-then-close", route, time.time(), time.monotonic())
            with httpx.Client(timeout=CLIENT_TIMEOUT_S, trust_env=False) as c:
                with c.stream("POST", node.url + route, json=request_body(route, 0, 0)) as r:
                    op.status, op.rid = r.status_code, r.headers.get("x-hub-pool-request-id")
                    read_stream(r, op)
            deadline = time.monotonic() + 5
            while True:
                with node.client(headers=node.headers()) as c:
                    row = next(e for e in c.get(P + "/routing-log").json()["entries"] if e["id"] == op.rid)
                if row["outcome"] != "pending" or time.monotonic() > deadline:
                    return op, row
                time.sleep(0.05)
    finally:
        engine.close()


@pytest.mark.parametrize("route", ROUTES)
def test_an_answer_whole_before_its_connection_died_is_logged_served(tmp_path, route):
    """The chaos test's narrowest case, made deterministic: a peer SIGKILLed between relaying
    an answer's closing frame and the end of the HTTP body. The app got the whole answer, so
    the row says served, not failed/truncated-upstream (the chaos test caught that mismatch
    before the pump (proxy/pump.py) asked its StreamJudge whether the final frame had passed)."""
    op, row = final_frame_then_cut(tmp_path, route)
    assert op.status == 200 and op.final and op.tokens == 3 and not op.frames_after_final, op
    assert (row["outcome"], row["status"], row["requestError"]) == ("served", 200, None), row


def routing_log(node) -> dict:
    return node.op("GET", "/routing-log?limit=10000")


@pytest.mark.timeout(180)
def test_killing_a_peer_every_10s_under_32_streams_loses_no_request_before_headers(tmp_path):
    victim_fqdn = fqdn(VICTIM)
    with ExitStack() as stack:
        sims = {name: stack.enter_context(run_in_thread(SimConfig(
            flavor="ollama", models=[SimModel(MODEL)], slots=64, decode_ms_per_token=MS_PER_TOKEN,
            tokens=TOKENS, prefill_tps=PREFILL_TPS, prompt_cache=False))) for name in NAMES}
        nodes = make_process_pool(
            tmp_path, NAMES, environ={"HUB_POOL_ROUTING_LOG_SIZE": "10000"},
            per_node={name: {"OLLAMA_URL": sim.url} for name, sim in sims.items()},
            settings={"poolHealthPollSeconds": 10}, warm=(VICTIM,) if WARM_RESTARTS else ())

        def stop_all() -> None:
            for n in nodes.values():
                n.stop(grace=5)

        stack.callback(stop_all)
        setup_started = time.monotonic()
        for name in NAMES:  # in order: each pairing's requester then ticks before its approver
            nodes[name].start()
        for x, y in (("hub-a", "hub-b"), ("hub-a", "hub-c"), ("hub-b", "hub-c")):
            pair(nodes, x, y)
        for n in nodes.values():
            n.op("PATCH", "/settings", {"poolHealthPollSeconds": 10})
            assert n.op("GET", "/settings")["poolHealthPollSeconds"] == 10
        wait_connected(nodes, timeout=45, model=MODEL)
        for name in ENTRIES:
            entry = nodes[name]
            entry.op("POST", "/pins", {"scope": "default", "targetKind": "peer",
                                       "targetPeerId": entry.peer_id(VICTIM)})
            pins = entry.op("GET", "/status")["pins"]
            assert pins[0]["nodeFqdn"] == victim_fqdn and pins[0]["targetAvailable"] is True, pins
        # a warm-up request from each entry reaches the victim, as the pin says
        for name in ENTRIES:
            r = httpx.post(nodes[name].url + "/api/chat", json={**request_body("/api/chat", -1, 0), "stream": False},
                           timeout=CLIENT_TIMEOUT_S, trust_env=False)
            assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] == victim_fqdn, r.text
        warmup_rows = {name: {e["id"] for e in routing_log(nodes[name])["entries"]} for name in ENTRIES}

        # -- the load, and the chaos ----------------------------------------------------
        ops: list[Operation] = []
        events: list[dict] = []
        chaos_errors: list[str] = []
        rr = itertools.count()
        urls = {name: nodes[name].url for name in ENTRIES}
        t0 = time.monotonic()
        stop_at = t0 + LOAD_S
        killer = threading.Thread(target=chaos, args=(nodes[VICTIM], t0, stop_at, events, chaos_errors),
                                  daemon=True)
        workers = [threading.Thread(target=client_worker, args=(i, urls, ops, rr, stop_at), daemon=True)
                   for i in range(WORKERS)]
        killer.start()
        for w in workers:
            w.start()
        for w in workers + [killer]:
            w.join(max(0.0, stop_at + CLIENT_TIMEOUT_S + 10 - time.monotonic()))
        assert not any(w.is_alive() for w in workers + [killer]), "a client or the chaos thread did not finish"
        assert not chaos_errors, (chaos_errors, nodes[VICTIM].log_tail())
        assert nodes[VICTIM].alive()

        # every row settled (the last stream's bookkeeping can trail its final byte slightly)
        deadline = time.monotonic() + 10
        while True:
            logs = {name: routing_log(n) for name, n in nodes.items()}
            if all(lg["summary"]["pending"] == 0 for lg in logs.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.2)

        # every acquire was released: no forward or local request is still counted anywhere,
        # and no engine still holds a request
        deadline = time.monotonic() + 10
        while True:
            counts = {}
            for name, n in nodes.items():
                status = n.op("GET", "/status")
                counts[name] = {"local": status["localNode"]["inFlightRequests"],
                                **{p["nodeFqdn"]: p["inFlightRequests"] for p in status["peers"]}}
            engines = {name: {k: sim.stats()[k] for k in ("in_flight", "queued")} for name, sim in sims.items()}
            settled = (all(v == 0 for c in counts.values() for v in c.values())
                       and all(v == 0 for e in engines.values() for v in e.values()))
            if settled or time.monotonic() > deadline:
                break
            time.sleep(0.2)

        # -- what happened ---------------------------------------------------------------
        kills = [e["killed"] for e in events]

        def cut_by_a_kill(op: Operation) -> bool:
            return op.headers_at is not None and any(op.headers_at - 0.05 <= k <= op.end + 0.05 for k in kills)

        no_headers = [op for op in ops if op.headers_at is None]
        not_ok = [op for op in ops if op.headers_at is not None and op.status != 200]
        complete = [op for op in ops if op.status == 200 and op.final]
        unfinished = [op for op in ops if op.status == 200 and not op.final]
        served_by = Counter(op.served_by for op in ops)
        out_rows = {name: {e["id"]: e for e in logs[name]["entries"] if e["direction"] == "outbound"
                           and e["id"] not in warmup_rows[name]} for name in ENTRIES}
        failovers = [row for rows in out_rows.values() for row in rows.values() if row["failedOverFrom"]]
        # forwards the victim had been sent, and had not answered, when it was killed
        op_by_rid = {op.rid: op for op in ops if op.rid}

        def caught(row: dict, killed: float) -> bool:
            op = op_by_rid.get(row["id"])
            return op is not None and op.headers_at is not None and op.start < killed < op.headers_at

        in_flight = [r for r in failovers if "ECONNREFUSED" not in r["attempts"][0]["reason"]
                     and any(caught(r, k) for k in kills)]

        def cycle(i: int, e: dict) -> dict:
            """What one kill caught: streams the victim was carrying, forwards it had not
            answered, and forwards refused while it was down; and what it served before."""
            before = events[i - 1]["up"] if i else t0
            carried = [op for op in ops if op.served_by == victim_fqdn]
            refused = [r for r in failovers if "ECONNREFUSED" in r["attempts"][0]["reason"]]
            return {"killedAt": round(e["killed"] - t0, 2), "upAt": round(e["up"] - t0, 2),
                    "victimServedBefore": sum(1 for op in carried if before < op.headers_at < e["killed"]),
                    "cut": sum(1 for op in carried if not op.final
                               and op.headers_at - 0.05 <= e["killed"] <= op.end + 0.05),
                    "inFlightFailovers": sum(1 for r in in_flight if caught(r, e["killed"])),
                    "refusedFailovers": sum(1 for r in refused if r["id"] in op_by_rid
                                            and e["killed"] < op_by_rid[r["id"]].start < e["up"] + 1)}

        report = {
            "setupSeconds": round(t0 - setup_started, 1),
            "operations": len(ops), "complete": len(complete), "cutStreams": len(unfinished),
            "noHeaders": len(no_headers), "non200": len(not_ok), "servedBy": dict(served_by),
            "failovers": len(failovers),
            "failoversInFlightAtKill": len(in_flight),
            "failoverReasons": dict(Counter(a["reason"] for r in failovers for a in r["attempts"])),
            "killCycles": [cycle(i, e) for i, e in enumerate(events)],
            "peerStatusAtEnd": {name: {p["nodeFqdn"]: (p["status"], p["consecutiveFailures"])
                                       for p in nodes[name].op("GET", "/status")["peers"]} for name in ENTRIES},
            "victimBoots": nodes[VICTIM].boots,
        }
        (tmp_path / "chaos-report.json").write_text(json.dumps(
            {"report": report, "ops": [asdict(op) for op in ops], "logs": logs,
             "victimLogs": [e["log"] for e in events]}, indent=1))
        print("\nchaos report:", json.dumps(report, indent=1))

        assert settled, ("in-flight counts that never returned to zero", counts, engines)
        assert len(events) >= 2, events
        assert len(ops) >= 300, report  # 32 streams for 30 s really ran
        assert served_by[victim_fqdn] >= 50, report  # the victim really carried work between kills

        # (1) no request failed before headers: a forward to a dead hub-b failed over
        assert not no_headers, ("requests that never received headers", [op.brief() for op in no_headers[:20]])
        assert not not_ok, ("requests answered with an error", [op.brief() for op in not_ok[:20]])

        # (2) a stream cut after headers is the victim's, was cut by a kill, and has no invented ending;
        # a complete stream carries the whole answer, once
        wrong_cuts = [op for op in unfinished if op.served_by != victim_fqdn or not cut_by_a_kill(op)]
        assert not wrong_cuts, ("streams that ended without their final frame for no kill",
                                [op.brief() for op in wrong_cuts[:20]])
        short = [op for op in complete if op.tokens != TOKENS or op.frames_after_final or op.error]
        assert not short, ("a final frame on an incomplete or malformed answer", [op.brief() for op in short[:20]])

        # (3) the routing logs account for every request
        rids = [op.rid for op in ops]
        assert all(rids) and len(set(rids)) == len(rids), "every answer names a distinct request id"
        problems = []
        for name in ENTRIES:
            mine = {op.rid: op for op in ops if op.entry == name}
            rows = out_rows[name]
            other = out_rows[ENTRIES[1 - ENTRIES.index(name)]]
            problems += [f"{name}: no outbound row for {op.brief()}" for rid, op in mine.items() if rid not in rows]
            problems += [f"{name}: outbound row no client sent: {row}" for rid, row in rows.items() if rid not in mine]
            problems += [f"{name}: its request {rid} also has an outbound row on the other entry"
                         for rid in mine if rid in other]
            for rid, op in mine.items():
                row = rows.get(rid)
                if row is None:
                    continue
                if row["pin"] != {"scope": "default", "mode": "prefer", "targetKind": "peer"}:
                    problems.append(f"{name}: row without the pin: {row}")
                if row["clientClosed"]:
                    problems.append(f"{name}: clientClosed on a request the client read to the end: {row}")
                if set(row["failedOverFrom"]) - {victim_fqdn} or len(row["failedOverFrom"]) > 1:
                    problems.append(f"{name}: failedOverFrom names more than one pass over the victim: {row}")
                if row["failedOverFrom"] and (row["node"] == victim_fqdn or row["attempts"][0]["node"] != victim_fqdn):
                    problems.append(f"{name}: a failover row inconsistent with its attempts: {row}")
                if op.final:
                    if (row["outcome"], row["status"], row["node"]) != ("served", 200, op.served_by):
                        problems.append(f"{name}: complete answer {op.brief()} but row says {row['outcome']} "
                                        f"{row['status']} on {row['node']}: {row}")
                else:
                    sig = (row["requestError"] or {}).get("signature")
                    if (row["outcome"], row["node"], sig) != ("failed", victim_fqdn, "truncated-upstream"):
                        problems.append(f"{name}: cut stream {op.brief()} but row says {row['outcome']} on "
                                        f"{row['node']} ({sig}): {row}")
        # forwards to the surviving peer left their inbound row there under the same id
        for op in complete:
            if op.served_by in (fqdn(n) for n in ENTRIES):
                server = next(n for n in ENTRIES if fqdn(n) == op.served_by)
                inbound = next((e for e in logs[server]["entries"] if e["id"] == op.rid), None)
                if inbound is None or (inbound["direction"], inbound["outcome"], inbound["node"]) != (
                        "inbound", "served", fqdn(op.entry)):
                    problems.append(f"{server}: inbound row for {op.brief()} is {inbound}")
        # (5) every boot of the victim logged every forward it answered: its log is read just before
        # each kill, and at the end for its current boot. A forward whose headers reached the client
        # before that read has its inbound row there (outcome served is set before headers go back).
        # Bytes a killed process had already sent can still reach the client a moment after the kill,
        # and the next boot starts DOWN_S later: a boot's forwards are those whose headers arrived
        # between half a second after the previous kill and the read.
        boots = [(e["asked"], e["log"]) for e in events] + [(time.monotonic(), logs[VICTIM])]
        boot_ids = [lg["summary"]["bootId"] for _, lg in boots if lg is not None]
        assert len(set(boot_ids)) == len(boot_ids), "each restart of the victim is a new boot"
        checked, headers_lost, previous_kill = 0, 0, float("-inf")
        for (asked, b_log), killed in zip(boots, [e["killed"] for e in events] + [float("inf")]):
            if b_log is None:
                previous_kill = killed
                continue
            b_rows = {e["id"]: e for e in b_log["entries"]}
            boot = b_log["summary"]["bootId"][:8]
            for op in ops:
                if op.served_by == victim_fqdn and previous_kill + 0.5 < op.headers_at < asked:
                    checked += 1
                    row = b_rows.get(op.rid)
                    if row is None or (row["direction"], row["outcome"], row["node"]) != (
                            "inbound", "served", fqdn(op.entry)):
                        problems.append(f"{VICTIM} boot {boot}: inbound row for {op.brief()} is {row}")
            for rid, row in b_rows.items():
                op = op_by_rid.get(rid)
                if op is None:
                    if not any(rid in w for w in warmup_rows.values()):
                        problems.append(f"{VICTIM} boot {boot}: inbound row no client sent: {row}")
                elif row["outcome"] == "served" and op.served_by != victim_fqdn:
                    # the one race this read allows: the victim sets `served` as its headers go
                    # out, this log was read, and the kill landed before the answer's first token
                    # reached the sender (before its headers left, or after them: the entry node
                    # commits a stream at its first token), so the sender saw the connection die
                    # with nothing committed to the app and failed over
                    sender = out_rows[op.entry].get(rid) or {}
                    died = [a for a in sender.get("attempts") or []
                            if a["node"] == victim_fqdn and ((a.get("reason") or "").startswith("fetch failed")
                                                             or "before its first token" in (a.get("reason") or ""))]
                    if died and op.start < killed and op.headers_at is not None and op.headers_at > killed:
                        headers_lost += 1
                        continue
                    problems.append(f"{VICTIM} boot {boot}: served a request its sender says {op.served_by} "
                                    f"served: {row} / {op.brief()}")
                elif row["outcome"] == "failed":
                    sender = out_rows[op.entry].get(rid) or {}
                    if not any(a["node"] == victim_fqdn and a["status"] == row["status"]
                               for a in sender.get("attempts") or []):
                        problems.append(f"{VICTIM} boot {boot}: refused {row} but its sender's row does not show "
                                        f"that attempt: {sender}")
            previous_kill = killed
        for name in ENTRIES:
            summary = logs[name]["summary"]
            mine = len([f for f in failovers if f["id"] in out_rows[name]])
            if (summary["failovers"], summary["clientClosed"], summary["pending"]) != (mine, 0, 0):
                problems.append(f"{name}: summary {summary} disagrees with its rows ({mine} failovers)")
        # each answer the clients saw began at an engine (a forward that died before its headers
        # may have reached one too, so this is a floor)
        engine_chats = sum(sim.stats()["by_path"].get(route, 0) for sim in sims.values() for route in ROUTES)
        report["engineChatRequests"] = engine_chats
        if engine_chats < len(ops) + len(ENTRIES):
            problems.append(f"the engines saw {engine_chats} chat requests, fewer than the {len(ops)} answers "
                            f"(+{len(ENTRIES)} warm-up)")
        report["victimRowsChecked"] = checked
        report["victimServedButKilledBeforeItsHeadersLeft"] = headers_lost
        report["victimBootsLogged"] = len(boot_ids)
        print("victim inbound rows checked across its boots:", checked, "; engine chat requests:", engine_chats)
        assert not problems, "\n".join(problems[:40]) + f"\n({len(problems)} problems)"

        # (4) the kill was exercised: work failed over from the victim to another node, including
        # forwards the victim had accepted and not yet answered when it died (not only refused
        # connections while it was down)
        assert failovers, report
        assert in_flight, ("no forward was caught in flight before its headers by a kill", report)
        assert all(r["node"] != victim_fqdn and r["outcome"] == "served" for r in failovers), failovers[:5]
