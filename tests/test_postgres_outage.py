"""Two nodes whose stores are PostgreSQL databases, with PostgreSQL down at start, then stopped
mid-run and started again: each node keeps routing (peers from memory), says so in its log and
/status, answers 503 database_unavailable to a change that needs the store, and recovers
without a restart.

Runs against a throwaway cluster of its own (tests/pg_cluster.py), so stopping it never disturbs
the shared one the other PostgreSQL runs use; it runs when HUBPOOL_TEST_POSTGRES_URL is set
(scripts/test_postgres.sh, .ci/run) and skips otherwise.
"""

from __future__ import annotations

import logging
import os
import shutil
from contextlib import ExitStack

import httpx
import pytest
from harness import fqdn, make_pool
from pg_cluster import Cluster, pg_bin, scratch_root
from sqlalchemy import create_engine, text

from hubpool_core.cli.status_commands import _status_lines
from hubpool_sim import SimConfig, SimModel, run_in_thread

P = "/api/inference/pool"
CHAT = {"messages": [{"role": "user", "content": "hello"}], "stream": False}

pytestmark = pytest.mark.skipif(
    not os.environ.get("HUBPOOL_TEST_POSTGRES_URL") or pg_bin() is None,
    reason="PostgreSQL run skipped: HUBPOOL_TEST_POSTGRES_URL is not set or PostgreSQL's binaries are missing "
           "(scripts/test_postgres.sh installs nothing, starts a throwaway cluster and sets it)")


def op(node, method, path, body=None, expect=200):
    with node.client(headers=node.headers()) as c:
        r = c.request(method, P + path, json=body)
    assert expect is None or r.status_code == expect, (r.status_code, r.text)
    return r


def chat(node, model):
    return httpx.post(node.url + "/api/chat", json={"model": model, **CHAT}, timeout=60, trust_env=False)


def tick(*nodes):
    for n in nodes:
        n.run(n.node.health.poll_once())


def database(node) -> dict:
    return op(node, "GET", "/status").json()["database"]


def test_postgres_down_at_start_and_mid_run_keeps_routing_and_recovers(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="hubpool.store")
    root = scratch_root()
    cluster = Cluster(root)
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, root, True)
        stack.callback(lambda: cluster.running() and cluster.stop("immediate"))
        cluster.init().start()
        admin = create_engine(cluster.url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            for name in ("hub_a", "hub_b"):
                conn.execute(text(f"CREATE DATABASE {name}"))
        admin.dispose()
        cluster.stop()  # down before either node starts
        urls = {n: cluster.url.rsplit("/", 1)[0] + "/" + n.replace("-", "_") for n in ("hub-a", "hub-b")}
        # hub-a has no engine of its own: everything it serves is hub-b's, through the pool
        sim = stack.enter_context(run_in_thread(SimConfig(flavor="ollama", models=[SimModel("llama3.2:3b")],
                                                          decode_ms_per_token=0)))
        nodes = make_pool(tmp_path, ["hub-a", "hub-b"], per_node={
            "hub-a": {"HUB_POOL_DATABASE_URL": urls["hub-a"]},
            "hub-b": {"HUB_POOL_DATABASE_URL": urls["hub-b"], "OLLAMA_URL": sim.url}})
        a, b = nodes["hub-a"], nodes["hub-b"]
        for n in (a, b):
            stack.enter_context(n)

        # 1. down at start: the nodes are up, say so, and hub-b serves its own engine
        for n in (a, b):
            db = database(n)
            assert db["backend"] == "postgresql" and db["available"] is False and db["migrationPending"] is True
            assert db["error"] and db["downSince"]
            assert "hubpool@127.0.0.1" in db["url"]
        assert any("database unreachable" in r.getMessage() for r in caplog.records)
        r = chat(b, "llama3.2:3b")
        assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] == "local", r.text
        refused = op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-b")}, expect=503).json()
        assert refused["code"] == "database_unavailable" and "unreachable" in refused["error"]

        # 2. PostgreSQL comes up: the next health tick migrates, and the nodes pair over it
        cluster.start()
        tick(a, b)
        for n in (a, b):
            db = database(n)
            assert db["available"] is True and db["migrationPending"] is False and db["error"] is None
        assert any("database reachable again" in r.getMessage() for r in caplog.records)
        pin = op(b, "POST", "/pairing-pin").json()["pin"]
        op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-b"), "pin": pin})
        op(b, "POST", f"/peers/{fqdn('hub-a')}/approve")
        tick(a, b)
        tick(a, b)  # the second round: both sides sign
        _row, key = a.node.keys.create("editor", "inference")
        assert a.node.keys.resolve(key) is not None  # seen valid once by this process
        r = chat(a, "llama3.2:3b")
        assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] == fqdn("hub-b"), r.text
        with create_engine(urls["hub-a"]).connect() as conn:  # the pairing is in PostgreSQL
            assert conn.execute(text("SELECT node_fqdn, status FROM hub_pool_peer")).all() == \
                [(fqdn("hub-b"), "connected")]

        # 3. PostgreSQL stops mid-run: routing goes on from memory, both ways (signed forwards)
        caplog.clear()
        cluster.stop()
        tick(a, b)
        for n in (a, b):
            assert database(n)["available"] is False
        assert any("database unreachable" in r.getMessage() for r in caplog.records)
        for _ in range(3):
            r = chat(a, "llama3.2:3b")
            assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] == fqdn("hub-b"), r.text
        seen = a.node.keys.resolve(key)  # a key already seen valid keeps working from memory
        assert seen is not None and seen.scope == "inference"
        assert a.node.keys.resolve("hpi_never-seen-before") is None
        peers = op(a, "GET", "/status").json()["peers"]
        assert [p["nodeFqdn"] for p in peers] == [fqdn("hub-b")]  # the status page still lists it
        refused = op(a, "POST", f"/peers/{fqdn('hub-b')}/disable", expect=503).json()
        assert refused["code"] == "database_unavailable"
        said = "\n".join(_status_lines(op(a, "GET", "/status").json()))  # what `hubpool status` prints
        assert "Database" in said and "UNREACHABLE since" in said and "routing goes on from memory" in said

        # 4. PostgreSQL is back: no restart; the change that was refused now lands
        caplog.clear()
        cluster.start()
        tick(a, b)
        for n in (a, b):
            assert database(n)["available"] is True
        assert any("database reachable again" in r.getMessage() for r in caplog.records)
        op(a, "POST", f"/peers/{fqdn('hub-b')}/disable")
        op(a, "POST", f"/peers/{fqdn('hub-b')}/enable")
        r = chat(a, "llama3.2:3b")
        assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] == fqdn("hub-b"), r.text
