"""Shared fixtures: simulated engines and real nodes on loopback."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import pytest
from harness import RunningNode

from hubpool_sim import SimConfig, SimModel, run_in_thread


@pytest.fixture
def ollama_sim() -> Iterator:
    cfg = SimConfig(flavor="ollama", models=[SimModel("llama3.2:3b", window=8192),
                                             SimModel("nomic-embed-text", window=2048, embedding=True)])
    with run_in_thread(cfg) as sim:
        yield sim


@pytest.fixture
def vllm_sim() -> Iterator:
    cfg = SimConfig(flavor="vllm", models=[SimModel("qwen3:8b", window=16384),
                                           SimModel("bge-small", window=512, embedding=True)])
    with run_in_thread(cfg) as sim:
        yield sim


@pytest.fixture
def node(tmp_path, ollama_sim, vllm_sim) -> Iterator[RunningNode]:
    """A node whose own engines are a simulated Ollama and a simulated vLLM."""
    with RunningNode(tmp_path / "node", {"OLLAMA_URL": ollama_sim.url, "VLLM_URL": vllm_sim.url}) as n:
        yield n


# -- the store on SQLite and on PostgreSQL ----------------------------------------------

#: the cluster the PostgreSQL runs use (scripts/test_postgres.sh or .ci/run starts one and exports it)
POSTGRES_URL_VAR = "HUBPOOL_TEST_POSTGRES_URL"


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[Callable[[str], str]]:
    """Fresh database URLs, one per name: SQLite files in the test's directory, or (the second
    run) a fresh database on the PostgreSQL cluster HUBPOOL_TEST_POSTGRES_URL names, dropped at
    the end. The store, pairing, identity, API-key and migration tests take this one fixture so
    every one of them runs against both backends."""
    if request.param == "sqlite":
        yield lambda name: f"sqlite:///{tmp_path / (name + '.db')}"
        return
    admin_url = os.environ.get(POSTGRES_URL_VAR)
    if not admin_url:
        pytest.skip(f"PostgreSQL run skipped: {POSTGRES_URL_VAR} is not set "
                    "(scripts/test_postgres.sh starts a throwaway cluster and sets it)")
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    made: list[str] = []

    def fresh(name: str) -> str:
        db_name = f"hp_{uuid.uuid4().hex[:12]}_{''.join(c for c in name if c.isalnum())[:20]}".lower()
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{db_name}"'))
        made.append(db_name)
        return make_url(admin_url).set(database=db_name).render_as_string(hide_password=False)

    try:
        yield fresh
    finally:
        with admin.connect() as conn:
            for db_name in made:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)'))
        admin.dispose()
