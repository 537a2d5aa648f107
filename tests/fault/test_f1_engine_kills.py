"""F1: 64 concurrent streams at a simulated 20 tokens/s across three nodes; every 5 s the engine
with the most requests in flight is SIGKILLed and started again 2 s later.

Pass: no request that had not received headers is lost (each fails over and is answered); no cut
stream ever ends with a final frame at the client, and every cut one is logged failed /
truncated-upstream; the routing logs of all three nodes match the client history one to one
(history.reconcile); afterwards every in-flight counter is back to zero.

The issue's figures run by default: 60 s of load, a kill at 5, 10, ... 55 s (eleven; one at 60 s
would have no load left to cut), about 75 s with setup on the two-core CI machine.
HUBPOOL_F1_SECONDS shortens it (30 gives five kills in ~45 s) when the machine is busier.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from datetime import datetime

import httpx
import pytest
from history import INDETERMINATE, OK, History, reconcile, run_op
from rig import Rig, chat_body, metric, sim_args

pytestmark = [pytest.mark.fault, pytest.mark.timeout(300)]
NAMES = ["hub-a", "hub-b", "hub-c"]
STREAMS = 64
MS_PER_TOKEN = 50  # 20 tokens/s
TOKENS = 20
LOAD_S = float(os.environ.get("HUBPOOL_F1_SECONDS", "60"))
KILL_EVERY_S, DOWN_S = 5.0, 2.0
ROUTES = ("/api/chat", "/v1/chat/completions")
#: ~60 prompt tokens at 400 tokens/s: ~150 ms before an engine sends headers, so each kill finds
#: requests in flight that have not received headers yet
PREFILL_TPS = 400
PADDING = " Answer briefly." * 14
MAX_OPS_PER_WORKER = 500  # a bound far above what LOAD_S of one-second streams can reach


def test_f1_killing_the_busiest_engine_every_5s_under_64_streams(tmp_path, report):
    sim = sim_args(ms_per_token=MS_PER_TOKEN, tokens=TOKENS, slots=STREAMS, prefill_tps=PREFILL_TPS)
    with Rig(tmp_path, NAMES, sim=sim) as rig:
        urls = {n: rig.nodes[n].url for n in NAMES}
        history = History()
        kills: list[dict] = []
        errors: list[str] = []
        t0 = time.monotonic()
        stop_at = t0 + LOAD_S
        rr = itertools.count()

        def worker(k: int) -> None:
            with httpx.Client(timeout=20, trust_env=False) as c:
                for seq in range(MAX_OPS_PER_WORKER):
                    if time.monotonic() >= stop_at:
                        return
                    entry = NAMES[next(rr) % 3]
                    route = ROUTES[(k + seq) % 2]
                    run_op(c, history, entry, urls[entry], route, chat_body(route, f"w{k} s{seq}.{PADDING}"))

        def chaos() -> None:
            try:
                for i in range(1, 100):
                    at = t0 + i * KILL_EVERY_S
                    if at + DOWN_S >= stop_at:
                        return
                    time.sleep(max(0.0, at - time.monotonic()))
                    in_flight = {}
                    for n, s in rig.sims.items():
                        try:
                            in_flight[n] = s.stats()["in_flight"] if s.alive() else -1
                        except httpx.HTTPError:
                            in_flight[n] = -1
                    victim = max(in_flight, key=in_flight.get)
                    killed, killed_wall = time.monotonic(), time.time()
                    rig.sims[victim].kill()
                    time.sleep(DOWN_S)
                    rig.sims[victim].start()
                    kills.append({"victim": victim, "inFlight": in_flight, "killedAt": round(killed - t0, 2),
                                  "upAt": round(time.monotonic() - t0, 2), "killed": killed,
                                  "killedWall": killed_wall})
            except Exception as exc:  # noqa: BLE001 - reported by the test
                errors.append(f"{type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(STREAMS)]
        threads.append(threading.Thread(target=chaos, daemon=True))
        for t in threads:
            t.start()
        for t in threads:
            t.join(LOAD_S + 60)
        assert not any(t.is_alive() for t in threads), "a worker outlived its bound"
        assert not errors, errors
        ops = history.ops

        # afterwards: every in-flight counter back to zero (nodes and engines)
        deadline = time.monotonic() + 15
        while True:
            counts = {n: metric(rig.metrics(n), "hubpool_in_flight") for n in NAMES}
            engines = {n: s.stats()["in_flight"] for n, s in rig.sims.items()}
            if (not any(counts.values()) and not any(engines.values())) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        logs = rig.logs(settle_s=15)
        rec = reconcile(history, logs, rig.fqdns)
        cut = [op for op in ops if op.outcome == INDETERMINATE]
        whole = [op for op in ops if op.outcome == OK]
        failovers = [r for n in NAMES for r in logs[n] if r["direction"] == "outbound" and r["failedOverFrom"]]
        by_reason: dict[str, int] = {}
        for r in failovers:
            for a in r["attempts"]:
                key = a["reason"].split(" (")[0][:40]
                by_reason[key] = by_reason.get(key, 0) + 1
        failover_ms = sorted(r["durationMs"] for r in failovers if r["durationMs"] is not None)
        figures = {
            "loadSeconds": LOAD_S, "streams": STREAMS, "setupSeconds": round(rig.setup_s, 1),
            "operations": len(ops), "whole": len(whole), "cutAfterHeaders": len(cut),
            "lostBeforeHeaders": len(history.lost()), "non200": sum(1 for op in ops if op.status not in (None, 200)),
            "failovers": len(failovers), "failoverReasons": by_reason,
            "failoverHeadersMs": {"p50": failover_ms[len(failover_ms) // 2] if failover_ms else None,
                                  "p95": failover_ms[int(len(failover_ms) * 0.95)] if failover_ms else None,
                                  "max": failover_ms[-1] if failover_ms else None},
            "kills": [{k: v for k, v in e.items() if k not in ("killed", "killedWall")} for e in kills],
            "servedBy": {s: sum(1 for op in ops if op.served_by == s) for s in {op.served_by for op in ops}},
            "reconciled": rec.matched, "inboundRowsChecked": rec.inbound_checked,
            "inFlightAfter": counts, "engineInFlightAfter": engines,
        }
        (tmp_path / "f1-history.json").write_text(json.dumps({"figures": figures, "ops": history.dump(),
                                                                   "kills": kills, "logs": logs}, indent=1))
        report("F1", figures)

        assert len(kills) >= max(1, int(LOAD_S // KILL_EVERY_S) - 1), kills
        assert len(ops) >= STREAMS * LOAD_S / 3, figures  # the load really ran
        # (1) nothing lost before headers, nothing answered with an error
        assert not history.lost(), [op.brief() for op in history.lost()[:10]]
        assert figures["non200"] == 0, [op.brief() for op in ops if op.status != 200][:10]
        # (2) no cut stream ends with a final frame; every whole answer is whole, once
        assert all(not op.final for op in cut)
        bad = [op for op in whole if op.tokens != TOKENS or op.frames_after_final]
        assert not bad, [op.brief() for op in bad[:10]]
        # (2) every cut stream was cut by a kill: it was being read when an engine died
        # (the node's own clock says when its headers came: at + durationMs on the entry's row; the
        # client may read them much later on a saturated machine, so its clock would not do)
        out_rows = {r["id"]: r for n in NAMES for r in logs[n] if r["direction"] == "outbound"}
        # a forwarded stream's row on the node that served it (the same request id)
        in_rows = {r["id"]: r for n in NAMES for r in logs[n] if r["direction"] == "inbound"}

        def headers_wall(row) -> float:
            return datetime.fromisoformat(row["at"].replace("Z", "+00:00")).timestamp() + row["durationMs"] / 1000

        def cut_by_a_kill(op) -> bool:
            row = out_rows.get(op.rid)
            if row is None or row["durationMs"] is None:
                return False
            # a forwarded stream flows from the serving node first: its headers left there
            # before the entry node relayed them, by 0.1 s once on a saturated machine, and a
            # kill in between cut a stream that was already being read (CI, 2026-12-06)
            began = min(headers_wall(r) for r in (row, in_rows.get(op.rid))
                        if r is not None and r["durationMs"] is not None)
            ended_wall = op.wall + (op.completed - op.invoked)
            return any(began - 0.05 <= e["killedWall"] <= ended_wall + 0.1 for e in kills)

        stray = [op for op in cut if not cut_by_a_kill(op)]
        assert not stray, [op.brief() for op in stray[:10]]
        # (2, 3) each cut stream logged failed / truncated-upstream, and everything one to one
        assert rec.ok(), "\n".join(rec.problems[:30]) + f"\n({len(rec.problems)} problems)"
        assert rec.matched == len(ops)
        # the kills were exercised: streams were cut, and requests failed over
        assert cut and failovers, figures
        assert not any(counts.values()) and not any(engines.values()), (counts, engines)
