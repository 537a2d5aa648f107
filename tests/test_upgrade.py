"""Upgrades: a data directory and database the previous release wrote (a committed fixture,
tests/data/upgrade/, made by scripts/make_upgrade_fixture.py from that release's own code) open
under this one with identity, pairings and keys intact; migrations run once, in order, on
SQLite and PostgreSQL; a database a newer release migrated is refused, never downgraded."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from harness import DATA, make_pool
from sqlalchemy import inspect, text

from hubpool_core.store import Database
from hubpool_core.store.db import MIGRATIONS, SchemaTooNew, head_revision

FIXTURE = DATA / "upgrade" / "0.1.0-45c33c7"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
P = "/api/inference/pool"


def upgrades_run(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The "Running upgrade A -> B" steps alembic logged, in order."""
    return [r.getMessage().split(",")[0] for r in caplog.records
            if r.name == "alembic.runtime.migration" and r.getMessage().startswith("Running upgrade")]


def copy_fixture(into: Path) -> Path:
    shutil.copytree(FIXTURE / "data", into)
    return into


def test_the_previous_releases_data_directory_opens_with_everything_it_held(tmp_path):
    copy_fixture(tmp_path / "hub-a")
    node = make_pool(tmp_path, ["hub-a"])["hub-a"]  # its data directory is the fixture's copy
    with node:
        assert node.operator_key == EXPECTED["operatorKey"]  # the operator key file, as it was
        with node.client(headers=node.headers()) as c:
            status = c.get(P + "/status").json()
        identity = status["localNode"]["identity"]
        assert (identity["nodeUuid"], identity["publicKeyFingerprint"]) == \
            (EXPECTED["nodeUuid"], EXPECTED["publicKeyFingerprint"])
        assert identity.get("canSign", True) is not False
        assert [{k: p[k] for k in ("nodeFqdn", "status", "authMode")} for p in status["peers"]] == EXPECTED["peers"]
        principal = node.node.keys.resolve(EXPECTED["inferenceKey"])
        assert principal is not None and principal.scope == "inference"
        assert status["database"]["available"] is True
    db = Database(f"sqlite:///{tmp_path / 'hub-a' / 'hubpool.db'}")
    assert db.current_revision() == head_revision() != EXPECTED["schemaRevision"]
    assert "hub_pool_routing_history" in inspect(db.engine).get_table_names()
    db.dispose()


def test_migrations_run_once_and_in_order_from_the_previous_release(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="alembic")
    copy_fixture(tmp_path / "data")
    db = Database(f"sqlite:///{tmp_path / 'data' / 'hubpool.db'}")
    assert db.current_revision() == EXPECTED["schemaRevision"]
    db.migrate()
    assert upgrades_run(caplog) == ["Running upgrade 0001 -> 0002"]
    caplog.clear()
    db.migrate()  # a second start: nothing to run
    Database(db.url).migrate()
    assert upgrades_run(caplog) == []
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [head_revision()]
        assert conn.execute(text("SELECT count(*) FROM hub_pool_peer")).scalar() == len(EXPECTED["peers"])
    db.dispose()


def test_a_fresh_and_a_previous_schema_migrate_in_order(store_url, caplog):
    caplog.set_level(logging.INFO, logger="alembic")
    fresh = Database(store_url("fresh"))
    fresh.migrate()
    assert upgrades_run(caplog) == ["Running upgrade  -> 0001", "Running upgrade 0001 -> 0002"]
    fresh.dispose()

    caplog.clear()
    old = Database(store_url("old"))
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection_engine"] = old.engine
    command.upgrade(cfg, "0001")  # as the previous release left it, with a row in it
    with old.engine.begin() as conn:
        conn.execute(text("INSERT INTO hub_pool_api_key (id, name, scope, key_hash, prefix) "
                          "VALUES ('k1', 'ci', 'inference', 'h1', 'hpi_x')"))
    caplog.clear()
    old.migrate()
    old.migrate()
    assert upgrades_run(caplog) == ["Running upgrade 0001 -> 0002"]
    with old.engine.connect() as conn:
        assert conn.execute(text("SELECT name FROM hub_pool_api_key")).scalars().all() == ["ci"]
        assert conn.execute(text("SELECT count(*) FROM hub_pool_routing_history")).scalar() == 0
    old.dispose()


def _newer(db: Database) -> None:
    with db.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0099'"))


def test_a_schema_from_a_newer_release_is_refused_not_downgraded(store_url):
    db = Database(store_url("newer"))
    db.migrate()
    _newer(db)
    with pytest.raises(SchemaTooNew, match=r"schema revision 0099, written by a newer hubpool.*never downgrades"):
        db.migrate()
    with db.engine.connect() as conn:  # untouched
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == ["0099"]
    db.dispose()


def _newer_fixture(tmp_path):
    """A copy of the fixture data directory whose database a newer release has migrated."""
    data = copy_fixture(tmp_path / "data")
    db = Database(f"sqlite:///{data / 'hubpool.db'}")
    db.migrate()
    _newer(db)
    db.dispose()
    return data, db


def _cli(data, *args: str, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUB_POOL_")}
    env.update({"HUB_POOL_DATA_DIR": str(data), "COLUMNS": "400", "HUB_POOL_TAILSCALE_CLI": "/nonexistent/tailscale",
                **extra})
    return subprocess.run([sys.executable, "-m", "hubpool_core.cli", *args], env=env, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_serve_refuses_a_newer_database_with_a_sentence(tmp_path):
    data, _ = _newer_fixture(tmp_path)
    done = _cli(data, "serve", HUB_POOL_LISTEN="127.0.0.1:0")
    assert done.returncode == 1
    assert "written by a newer hubpool" in done.stderr and "never downgrades a schema" in done.stderr
    assert "Traceback" not in done.stderr


def test_api_key_commands_refuse_a_newer_database_with_a_sentence(tmp_path):
    data, db = _newer_fixture(tmp_path)
    for args in (("api-key", "list"), ("api-key", "create", "--scope", "inference"), ("api-key", "revoke", "x")):
        done = _cli(data, *args)
        assert done.returncode == 1, (args, done.stderr)
        assert "written by a newer hubpool" in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
    with db.engine.connect() as conn:  # untouched
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == ["0099"]
    db.dispose()


def test_api_key_commands_say_an_unreachable_database_plainly(tmp_path):
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql+psycopg://hub:s3cret-pw@127.0.0.1:{port}/hubpool"
    done = _cli(tmp_path, "api-key", "list", HUB_POOL_DATABASE_URL=url)
    assert done.returncode == 69, done.stderr
    assert "cannot reach the database at postgresql+psycopg://hub:***@127.0.0.1" in done.stderr, done.stderr
    assert "s3cret-pw" not in done.stderr + done.stdout and "Traceback" not in done.stderr, done.stderr
