"""Routing history (HUB_POOL_HISTORY, docs/history.md): settled routing-log rows written in
batches off the hot path, exactly as the ring holds them, read back by the operator route and
`hubpool log --since`, pruned by retention, kept across a restart; on SQLite and PostgreSQL (the
store_url fixture), through running nodes as well as the store alone."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from harness import RunningNode, wait_until

from hubpool_core.store import Database
from hubpool_core.store.history import HistoryStore, parse_when

P = "/api/inference/pool"
#: a string only the prompts carry: it must never reach the history
SECRET = "prompt-marker-7d1f0c"


def chat(node, model: str):
    return httpx.post(node.url + "/api/chat", json={"model": model, "stream": False,
                                                    "messages": [{"role": "user", "content": SECRET}]},
                      timeout=60, trust_env=False)


def get(node, path: str, expect: int = 200) -> dict:
    with node.client(headers=node.headers()) as c:
        r = c.get(P + path)
    assert r.status_code == expect, (r.status_code, r.text)
    return r.json()


def wait_history(node, count: int, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        found = get(node, "/routing-history?limit=100")
        if found["matched"] >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _cli(node, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HUB_POOL_DATA_DIR": str(node.env.data_dir), "HUB_POOL_LISTEN": f"127.0.0.1:{node.port}",
           "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "hubpool_core.cli", *args], capture_output=True, text=True,
                          env=env, timeout=60, stdin=subprocess.DEVNULL)


HISTORY_ON = {"HUB_POOL_HISTORY": "sqlite", "HUB_POOL_HISTORY_FLUSH_MS": "100"}


def _history_env(request, store_url) -> dict[str, str]:
    """HISTORY_ON for a node: ``sqlite`` in its data directory, or (the PostgreSQL run of
    store_url) a fresh database URL on the test cluster."""
    if request.node.callspec.params["store_url"] == "sqlite":
        return dict(HISTORY_ON)
    return {**HISTORY_ON, "HUB_POOL_HISTORY": store_url("history")}


def _raw_history(data, setting: str) -> bytes:
    """Every byte the history holds: the SQLite files, or every column of every PostgreSQL row."""
    if setting == "sqlite":
        assert (data / "history.db").exists()
        return b"".join(p.read_bytes() for p in data.glob("history.db*"))
    from sqlalchemy import text

    db = Database(setting)
    try:
        with db.engine.connect() as conn:
            rows = conn.execute(text("SELECT * FROM hub_pool_routing_history")).all()
    finally:
        db.dispose()
    assert rows
    return repr(rows).encode()


def test_settled_rows_are_kept_exactly_as_the_ring_holds_them_and_survive_a_restart(request, store_url, tmp_path,
                                                                                      ollama_sim):
    data = tmp_path / "node"
    env = {"OLLAMA_URL": ollama_sim.url, **_history_env(request, store_url)}
    with RunningNode(data, env) as node:
        served = [chat(node, "llama3.2:3b") for _ in range(3)]
        missing = chat(node, "no-such-model:1b")
        assert all(r.status_code == 200 for r in served) and missing.status_code >= 400
        found = wait_history(node, 4)
        ring = {e["id"]: e for e in get(node, "/routing-log?limit=200")["entries"]}
        status = get(node, "/status")["history"]
    assert found["matched"] == 4
    for entry in found["entries"]:
        assert entry == ring[entry["id"]]  # the whole row, field for field
    assert [e["outcome"] for e in found["entries"]].count("failed") == 1
    assert status["enabled"] is True and status["written"] == 4 and status["error"] is None
    raw = _raw_history(data, env["HUB_POOL_HISTORY"])
    assert b"llama3.2:3b" in raw and SECRET.encode() not in raw  # metadata only: never a prompt

    with RunningNode(data, env) as again:  # a restart: the ring is empty, the history is not
        assert get(again, "/routing-log")["entries"] == []
        after = get(again, "/routing-history")
    assert [e["id"] for e in after["entries"]] == [e["id"] for e in found["entries"]]


def test_filters_through_the_route_and_the_cli(request, store_url, tmp_path, ollama_sim):
    with RunningNode(tmp_path / "node", {"OLLAMA_URL": ollama_sim.url, **_history_env(request, store_url)}) as node:
        for _ in range(2):
            assert chat(node, "llama3.2:3b").status_code == 200
        assert chat(node, "no-such-model:1b").status_code >= 400
        wait_history(node, 3)
        failed = get(node, "/routing-history?outcome=failed")
        assert failed["matched"] == 1 and failed["entries"][0]["model"] == "no-such-model:1b"
        assert get(node, "/routing-history?model=llama3.2:3b")["matched"] == 2
        assert get(node, "/routing-history?node=local")["matched"] == 2
        assert get(node, "/routing-history?since=2h")["matched"] == 3
        future = (datetime.now(UTC) + timedelta(minutes=5)).isoformat()
        assert get(node, "/routing-history?since=" + future.replace("+", "%2B"))["matched"] == 0
        bad = get(node, "/routing-history?since=yesterday", expect=400)
        assert "90s, 30m, 2h, 7d" in bad["error"]
        assert "served, failed" in get(node, "/routing-history?outcome=ok", expect=400)["error"]

        out = _cli(node, "log", "--since", "2h", "--outcome", "failed", "--json")
        assert out.returncode == 0, out.stderr
        assert [e["model"] for e in json.loads(out.stdout)["entries"]] == ["no-such-model:1b"]
        out = _cli(node, "log", "--since", "2h", "--model", "llama3.2:3b", "--node", "local", "--csv")
        assert out.returncode == 0, out.stderr
        rows = list(csv.DictReader(io.StringIO(out.stdout)))
        assert len(rows) == 2 and {r["outcome"] for r in rows} == {"served"} and rows[0]["node"] == "local"
        out = _cli(node, "log", "--since", "2h")
        assert out.returncode == 0 and "3 of 3 matching" in out.stdout, out.stdout + out.stderr
        out = _cli(node, "log", "--outcome", "maybe")
        assert out.returncode != 0 and "--outcome must be served or failed" in out.stderr + out.stdout


def test_history_off_says_how_to_turn_it_on(node):
    answer = get(node, "/routing-history", expect=409)
    assert answer["code"] == "history_off" and "HUB_POOL_HISTORY" in answer["error"]
    assert get(node, "/status")["history"] == {"enabled": False}


def _row(rid: str, at: datetime, outcome: str = "served", model: str = "m:1b") -> dict:
    return {"id": rid, "at": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"), "direction": "outbound",
            "path": "/api/chat", "model": model, "node": "local", "outcome": outcome, "status": 200,
            "failedOverFrom": [], "attempts": [], "totalMs": 5}


def test_the_store_writes_queries_and_prunes_by_retention(store_url):
    db = Database(store_url("history"))
    db.migrate()
    store = HistoryStore(db)
    now = datetime.now(UTC)
    rows = [_row("old", now - timedelta(days=40)), _row("week", now - timedelta(days=7), "failed"),
            _row("new", now - timedelta(minutes=5), model="other:2b")]
    assert store.write(rows, "boot-1") == 3
    assert [e["id"] for e in store.query()["entries"]] == ["new", "week", "old"]
    assert store.query()["entries"][0] == rows[2]
    assert [e["id"] for e in store.query(since=parse_when("2h"))["entries"]] == ["new"]
    assert [e["id"] for e in store.query(outcome="failed")["entries"]] == ["week"]
    assert store.query(model="other:2b")["matched"] == 1
    assert store.prune(30) == 1
    assert [e["id"] for e in store.query()["entries"]] == ["new", "week"]
    assert store.prune(1) == 1 and store.query()["matched"] == 1
    db.dispose()


def test_parse_when_accepts_durations_and_zoned_times_only():
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert parse_when("2h", now) == now - timedelta(hours=2)
    assert parse_when("90s", now) == now - timedelta(seconds=90)
    assert parse_when("1.5d", now) == now - timedelta(hours=36)
    assert parse_when("2026-12-01T09:00:00Z") == datetime(2026, 12, 1, 9, tzinfo=UTC)
    for bad in ("2026-12-01T09:00:00", "h", "-2h", "two hours", ""):
        with pytest.raises(ValueError, match="duration ago"):
            parse_when(bad, now)


class FlakyDatabase:
    """A history database that is down for its first ``down`` writes (the world, not the code)."""

    def __init__(self, down: int):
        self.down, self.batches, self.pruned = down, [], []

    def write(self, rows, boot_id):
        if self.down:
            self.down -= 1
            raise ConnectionError("connection refused")
        self.batches.append([r["id"] for r in rows])
        return len(rows)

    def prune(self, retention_days):
        self.pruned.append(retention_days)
        return 0


def test_the_recorder_batches_settled_rows_keeps_them_while_the_database_is_down_and_prunes():
    import asyncio

    from hubpool_core.telemetry.history import HistoryRecorder
    from hubpool_core.telemetry.routing_log import RoutingLog

    async def run() -> tuple[FlakyDatabase, HistoryRecorder, list[str]]:
        ring = RoutingLog()
        db = FlakyDatabase(down=1)
        recorder = HistoryRecorder(ring, db, flush_s=60, retention_days=7, clock=lambda: 0.0)
        rows = [ring.open(direction="outbound", path="/api/chat", model="m:1b") for _ in range(3)]
        old = "2026-01-01T00:00:00.000Z"  # settled long ago: past the settle grace
        for row in rows[:2]:
            row.update(outcome="served", status=200, durationMs=5, totalMs=9, updatedAt=old)
        await recorder.flush()  # the database is down: both kept, nothing lost
        assert db.batches == [] and recorder.status()["backlog"] == 2 and recorder.status()["error"]
        rows[2].update(outcome="failed", status=502, durationMs=0, totalMs=0, updatedAt=old)
        await recorder.flush()  # back: one batch with all three, in the order they settled
        return db, recorder, [r["id"] for r in rows]

    db, recorder, ids = asyncio.run(run())
    assert db.batches == [ids]
    assert recorder.status() | {"flushMs": 0} == {"enabled": True, "flushMs": 0, "retentionDays": 7, "written": 3,
                                                  "batches": 1, "backlog": 0, "inFlight": 0, "dropped": 0,
                                                  "refused": 0, "error": None}
    assert db.pruned == [7]  # pruned on the first successful pass, then hourly


def test_an_outage_part_way_through_a_row_by_row_batch_keeps_only_the_rows_left():
    """The store writes a refused batch row by row; when the database goes away part-way, the
    recorder keeps exactly the rows not yet written (the store says which) for its next try."""
    import asyncio

    from hubpool_core.store.history import HistoryWriteStopped
    from hubpool_core.telemetry.history import HistoryRecorder
    from hubpool_core.telemetry.routing_log import RoutingLog

    class Halfway:
        def __init__(self) -> None:
            self.calls: list[list[str]] = []

        def write(self, rows, boot_id):
            self.calls.append([r["id"] for r in rows])
            if len(self.calls) == 1:  # the first row goes, then the server is gone
                raise HistoryWriteStopped(ConnectionError("server closed the connection"), 1, list(rows[1:]))
            return len(rows)

        def prune(self, retention_days):
            return 0

    async def run() -> tuple[Halfway, HistoryRecorder, list[str]]:
        ring = RoutingLog()
        db = Halfway()
        recorder = HistoryRecorder(ring, db, flush_s=60, retention_days=7, clock=lambda: 0.0)
        rows = [ring.open(direction="outbound", path="/api/chat", model="m:1b") for _ in range(3)]
        for row in rows:
            row.update(outcome="served", status=200, durationMs=5, totalMs=9, updatedAt="2026-01-01T00:00:00.000Z")
        await recorder.flush()
        assert recorder.status()["backlog"] == 2 and recorder.status()["written"] == 1
        await recorder.flush()
        return db, recorder, [r["id"] for r in rows]

    db, recorder, ids = asyncio.run(run())
    assert db.calls == [ids, ids[1:]]
    assert recorder.status()["written"] == 3 and recorder.status()["refused"] == 0


# -- issue 26 item 8: one row the database refuses never stops the history ----------------------

#: what a caller can put in a model name that no column of the history can hold as it is
LONG = "x" * 400
NUL = "evil\u0000model"


def _refuse_poison(url: str) -> None:
    """The world refusing a row, whatever hubpool cleans: a rule in the database itself (a
    CHECK on PostgreSQL, a trigger on SQLite) that refuses a model named poison*."""
    from sqlalchemy import text

    db = Database(url)
    try:
        with db.engine.begin() as conn:
            if db.engine.dialect.name == "postgresql":
                conn.execute(text("ALTER TABLE hub_pool_routing_history ADD CONSTRAINT refuse_poison "
                                  "CHECK (model NOT LIKE 'poison%')"))
            else:
                conn.execute(text("CREATE TRIGGER refuse_poison BEFORE INSERT ON hub_pool_routing_history "
                                  "WHEN NEW.model LIKE 'poison%' BEGIN SELECT RAISE(ABORT, 'poison refused'); END"))
    finally:
        db.dispose()


def _columns(url: str) -> list[tuple]:
    from sqlalchemy import text

    db = Database(url)
    try:
        with db.engine.connect() as conn:
            return list(conn.execute(text("SELECT request_id, model FROM hub_pool_routing_history")).all())
    finally:
        db.dispose()


def test_a_refused_row_is_dropped_alone_and_history_goes_on(request, store_url, tmp_path, ollama_sim, caplog):
    """On main (PostgreSQL) a model name over 300 characters or holding NUL failed its batch,
    which was retried forever: nothing was written again, and a restart lost the backlog."""
    import logging

    data = tmp_path / "node"
    env = {"OLLAMA_URL": ollama_sim.url, **_history_env(request, store_url)}
    url = env["HUB_POOL_HISTORY"] if env["HUB_POOL_HISTORY"] != "sqlite" else f"sqlite:///{data / 'history.db'}"
    with caplog.at_level(logging.WARNING, logger="hubpool.history"), RunningNode(data, env) as node:
        # the columns' own limits: a long name and a NUL, each then followed by ordinary traffic
        assert chat(node, LONG).status_code >= 400
        assert chat(node, NUL).status_code >= 400
        assert chat(node, "llama3.2:3b").status_code == 200
        found = wait_history(node, 3)
        assert found["matched"] == 3, found
        ring = {e["id"]: e for e in get(node, "/routing-log?limit=200")["entries"]}
        for entry in found["entries"]:
            assert entry == ring[entry["id"]]  # the row itself, NUL and all, exactly as the ring holds it
        # then a row the database itself refuses, in one batch with good ones: the loop is held
        # and the test makes that one flush itself
        _refuse_poison(url)
        recorder = node.node.history
        node.run(recorder._periodic.stop())
        poison = chat(node, "poison:1b")
        beside = [chat(node, "llama3.2:3b") for _ in range(2)]
        assert poison.status_code >= 400 and all(r.status_code == 200 for r in beside)
        ids = {r.headers["x-hub-pool-request-id"] for r in (poison, *beside)}

        def settled_past_grace() -> bool:  # the recorder takes a row 250 ms after it settles
            now = datetime.now(UTC)
            rows = [e for e in get(node, "/routing-log?limit=200")["entries"] if e["id"] in ids]
            return len(rows) == 3 and all(e["totalMs"] is not None and (now - datetime.fromisoformat(
                e["updatedAt"].replace("Z", "+00:00"))).total_seconds() > 0.5 for e in rows)

        assert wait_until(settled_past_grace, timeout=20)
        batches = recorder.batches
        node.run(recorder.flush())
        assert recorder.batches == batches + 1 and recorder.status()["backlog"] == 0  # one batch, written
        node.node.loop.call_soon_threadsafe(recorder.start)  # the loop again
        after = [chat(node, "llama3.2:3b") for _ in range(3)]  # and history keeps going after it
        done = wait_history(node, 8)
        status = get(node, "/status")["history"]
    written_after = {e["id"] for e in done["entries"]} & {r.headers["x-hub-pool-request-id"] for r in after}
    print(f"\nhistory rows written after a refused row ({env['HUB_POOL_HISTORY'].split(':')[0]}): "
          f"{len(written_after) + 2} of 5 (2 in its batch, {len(written_after)} later); refused {status['refused']}")
    assert done["matched"] == 8, done  # 3 + the 2 beside the poison + 3 after; the poison alone is missing
    assert poison.headers["x-hub-pool-request-id"] not in {e["id"] for e in done["entries"]}
    assert len(written_after) == 3
    assert status["refused"] == 1 and status["error"] is None and status["backlog"] == 0, status
    said = [r.getMessage() for r in caplog.records if "refused row" in r.getMessage()]
    assert len(said) == 1 and poison.headers["x-hub-pool-request-id"] in said[0], said
    columns = _columns(url)
    assert all(model is None or (len(model) <= 300 and "\x00" not in model) for _, model in columns)
    assert "x" * 300 in {m for _, m in columns} and "evilmodel" in {m for _, m in columns}
