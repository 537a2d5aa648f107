"""How a walk ends when no candidate gives an answer, through a running node: what counts as
a failover (issue 26.19) and the shape of the 502 and 503 in each dialect (issue 26.25)."""

from __future__ import annotations

import logging
from contextlib import ExitStack

import anthropic
import httpx
import openai
import pytest
from harness import RunningNode, fqdn, make_pool, pair, poll_until_offered

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


#: route -> (body, the error shape the dialect's SDK reads)
AGENT_502 = {
    "/v1/messages": ({"max_tokens": 5, "messages": TURN}, "anthropic"),
    "/v1/messages/count_tokens": ({"messages": TURN}, "anthropic"),
    "/v1/responses": ({"input": "hello"}, "openai"),
    "/v1/rerank": ({"query": "q", "documents": ["a", "b"]}, "openai"),
}


def _assert_shape(body, shape, status):
    if shape == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == "api_error", body
        message = body["error"]["message"]
    else:
        assert body["error"]["type"] == "server_error" and "param" in body["error"], body
        message = body["error"]["message"]
    assert isinstance(message, str) and "pool candidate" in message, body


@pytest.mark.parametrize("route", list(AGENT_502))
def test_the_walks_502_is_in_the_agent_dialects_own_shape(tmp_path, route):
    """Issue 26.25: every candidate failing answered {"error": "All 1 pool candidates …"}, a
    string the agent SDKs cannot read as their error object."""
    body, shape = AGENT_502[route]
    model = "bge-reranker" if route == "/v1/rerank" else MODEL
    cfg = SimConfig(flavor="vllm", models=[SimModel(MODEL), SimModel("bge-reranker", reranker=True)])
    with run_in_thread(cfg) as sim, RunningNode(tmp_path / "n", {"VLLM_URL": sim.url}) as node:
        sim.add_fault("error:503")
        sim.add_fault({"fault": "error:503", "path": "/v1/messages/count_tokens"})  # not an inference route there
        r = httpx.post(node.url + route, json={"model": model, **body}, timeout=30)
        assert r.status_code == 502, r.text
        _assert_shape(r.json(), shape, 502)
        assert r.headers["x-hub-pool-request-id"]


def test_the_sdks_read_the_walks_502_as_their_own_error(tmp_path):
    cfg = SimConfig(flavor="vllm", models=[SimModel(MODEL)])
    with run_in_thread(cfg) as sim, RunningNode(tmp_path / "n", {"VLLM_URL": sim.url}) as node:
        sim.add_fault("error:503")
        claude = anthropic.Anthropic(base_url=node.url, api_key="unused-inside", max_retries=0)
        with pytest.raises(anthropic.InternalServerError) as messages:
            claude.messages.create(model=MODEL, max_tokens=5, messages=TURN)
        assert messages.value.status_code == 502 and "pool candidate" in messages.value.message
        assert messages.value.body["error"]["type"] == "api_error"
        codex = openai.OpenAI(base_url=node.url + "/v1", api_key="unused-inside", max_retries=0)
        with pytest.raises(openai.InternalServerError) as responses:
            codex.responses.create(model=MODEL, input="hello")
        assert responses.value.status_code == 502 and "pool candidate" in responses.value.body["message"]


def test_a_stored_responses_holder_that_is_gone_answers_the_openai_error_object(tmp_path):
    """The issue's own case: a follow-up naming a stored response can go only to the node that
    stored it; that node is down (its process gone, hub-a not yet polled), so the walk's one
    candidate refuses the connection: a 502 the OpenAI SDK parses, naming the failure."""
    with run_in_thread(SimConfig(flavor="vllm", models=[SimModel(MODEL)])) as sim:
        nodes = make_pool(tmp_path, ["hub-a", "hub-b"], per_node={"hub-b": {"VLLM_URL": sim.url}})
        a, b = nodes["hub-a"], nodes["hub-b"]
        with a:
            b.start()
            try:
                pair(a, b)
                poll_until_offered(a, [b], MODEL)
                codex = openai.OpenAI(base_url=a.url + "/v1", api_key="unused-inside", max_retries=0)
                first = codex.responses.with_raw_response.create(model=MODEL, input="remember tok")
                assert first.headers["x-hub-pool-served-by"] == fqdn("hub-b")
                rid = first.parse().id
            finally:
                b.stop()
            with pytest.raises(openai.InternalServerError) as gone:
                codex.responses.create(model=MODEL, input="and now?", previous_response_id=rid)
            assert gone.value.status_code == 502
            error = gone.value.body
            assert error["type"] == "server_error" and "ECONNREFUSED" in error["message"], error
