"""How a walk ends when no candidate gives an answer, through a running node: what counts as
a failover (issue 26.19) and the shape of the 502 and 503 in each dialect (issue 26.25)."""

from __future__ import annotations

import logging
from contextlib import ExitStack

import httpx
import pytest
from harness import RunningNode

from hubpool_sim import SimConfig, SimModel, run_in_thread

P = "/api/inference/pool"
MODEL = "m:8b"
TURN = [{"role": "user", "content": "hello"}]


def log_page(node):
    with node.client(headers=node.headers()) as c:
        r = c.get(P + "/routing-log?limit=500")
    assert r.status_code == 200, r.text
    return r.json()


def row_of(node, rid):
    return next(e for e in log_page(node)["entries"] if e["id"] == rid)


@pytest.fixture
def engines():
    """Two engines holding the same model (an Ollama and a vLLM): two local candidates."""
    with ExitStack() as stack:
        yield {flavor: stack.enter_context(run_in_thread(SimConfig(flavor=flavor, models=[SimModel(MODEL)])))
               for flavor in ("ollama", "vllm")}


def _failover_lines(caplog):
    return [r for r in caplog.records if r.name == "hubpool.relay" and r.getMessage().startswith("failover:")]


@pytest.mark.parametrize("fault,status", [("error:503", 502), ("verdict:invalid-message", 400)])
def test_a_walk_that_ran_out_on_its_only_candidate_is_not_a_failover(tmp_path, engines, caplog, fault, status):
    """Issue 26.19: the lone candidate answering 503 (the 502) or a verdict returned
    unconfirmed (the engine's 400) read failedOverFrom ["local"], summary.failovers 1 and a
    "failover" log line, though nothing was failed over to."""
    sim = engines["ollama"]
    with RunningNode(tmp_path / "n", {"OLLAMA_URL": sim.url}) as node:
        sim.add_fault(fault, count=1)
        with caplog.at_level(logging.INFO, logger="hubpool.relay"):
            r = httpx.post(node.url + "/v1/chat/completions", json={"model": MODEL, "messages": TURN}, timeout=30)
        assert r.status_code == status, r.text
        row = row_of(node, r.headers["x-hub-pool-request-id"])
        assert row["candidates"] == 1 and row["node"] == "local" and row["outcome"] == "failed", row
        assert row["failedOverFrom"] == [] and row["attempts"] == [], row
        assert log_page(node)["summary"]["failovers"] == 0
        assert _failover_lines(caplog) == []
        if status == 502:
            assert row["reason"] == "HTTP 503", row  # the row still says why the walk ended


def test_only_candidates_passed_over_for_another_are_failovers(tmp_path, engines, caplog):
    """Two candidates, both failing: the first was passed over for the second (one failover),
    the second was where the walk ran out (none)."""
    with RunningNode(tmp_path / "n", {"OLLAMA_URL": engines["ollama"].url, "VLLM_URL": engines["vllm"].url}) as node:
        for sim in engines.values():
            sim.add_fault("error:503", count=1)
        with caplog.at_level(logging.INFO, logger="hubpool.relay"):
            r = httpx.post(node.url + "/v1/chat/completions", json={"model": MODEL, "messages": TURN}, timeout=30)
        assert r.status_code == 502, r.text
        row = row_of(node, r.headers["x-hub-pool-request-id"])
        assert row["candidates"] == 2 and row["attempt"] == 2, row
        assert row["failedOverFrom"] == ["local"] and len(row["attempts"]) == 1, row
        first, last = row["attempts"][0]["backend"], row["backend"]
        assert {first, last} == {"ollama", "vllm"}, row
        assert log_page(node)["summary"]["failovers"] == 1
        assert len(_failover_lines(caplog)) == 1
        with node.client(headers=node.headers()) as c:
            metrics = c.get("/metrics").text
        assert 'hubpool_failovers_total{reason_kind="http_5xx"} 1.0' in metrics
