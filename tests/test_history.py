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
from harness import RunningNode

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
                                                  "error": None}
    assert db.pruned == [7]  # pruned on the first successful pass, then hourly
