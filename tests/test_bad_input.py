"""Every bad input gets a clear 4xx, never a 500; a model nothing serves gets the spec's 502."""

from __future__ import annotations

import pytest

ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/api/chat", "/api/generate",
          "/api/embed", "/api/embeddings"]


@pytest.mark.parametrize("route", ROUTES)
def test_malformed_json(node, route):
    with node.client() as c:
        r = c.post(route, content=b'{"model": "qwen3:8b", ', headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    assert "not valid JSON" in r.json()["error"]


@pytest.mark.parametrize("body", [b"[1, 2]", b'"text"', b"42", b"null"])
def test_body_not_an_object(node, body):
    with node.client() as c:
        r = c.post("/v1/chat/completions", content=body)
    assert r.status_code == 400
    assert "JSON object" in r.json()["error"]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("body", [{}, {"model": None}, {"model": 7}, {"model": ""}])
def test_body_without_a_model(node, route, body):
    with node.client() as c:
        r = c.post(route, json=body)
    assert r.status_code == 400
    assert r.json() == {"error": 'Request body must include a "model" field'}


def test_empty_body(node):
    with node.client() as c:
        r = c.post("/api/chat", content=b"")
    assert r.status_code == 400


def test_oversized_body(tmp_path, ollama_sim):
    from harness import RunningNode

    with RunningNode(tmp_path / "n", {"OLLAMA_URL": ollama_sim.url, "HUB_POOL_MAX_BODY_BYTES": "1000"}) as n, \
            n.client() as c:
        r = c.post("/api/chat", json={"model": "llama3.2:3b", "messages": [{"role": "user", "content": "x" * 5000}]})
        assert r.status_code == 413
        assert "HUB_POOL_MAX_BODY_BYTES" in r.json()["error"]
        chunked = c.post("/api/chat", content=iter([b'{"model": "llama3.2:3b", "x": "', b"y" * 5000, b'"}']))
        assert chunked.status_code == 413


def test_model_nothing_serves_gets_502_with_local_backends(node):
    with node.client() as c:
        r = c.post("/v1/chat/completions", json={"model": "no-such-model", "messages": []})
    assert r.status_code == 502
    body = r.json()
    assert body["error"].startswith('No pool node currently has model "no-such-model" available.')
    kinds = {b["type"]: b for b in body["localBackends"]}
    assert kinds["vllm"]["healthy"] is True and kinds["vllm"]["listsModel"] is False
    assert kinds["ollama"]["running"] is True
    assert kinds["lemonade"]["running"] is False and kinds["lemonade"]["error"]
    assert all(isinstance(b["probedMsAgo"], int) for b in body["localBackends"])
    assert r.headers["x-hub-pool-request-id"]
    assert "x-hub-pool-served-by" not in r.headers


def test_unknown_route_and_wrong_method(node):
    with node.client() as c:
        assert c.get("/v1/nothing").status_code == 404
        r = c.get("/v1/chat/completions")
    assert r.status_code == 405 and "error" in r.json()


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/api/chat"])
@pytest.mark.parametrize("stream,streams", [(1, True), ("true", True), (0, False), ("false", False)])
def test_a_stream_flag_that_is_not_a_boolean_is_left_to_the_engine(node, ollama_sim, route, stream, streams):
    """Issue 26 item 16 (and 25's door rule): `"stream": 1`, `0` or `"true"` was refused at the
    door with 400; an engine that reads it leniently serves it, so it reaches the engine, and the
    node reads it as such an engine does (1 and "true" stream, 0 and "false" do not)."""
    before = ollama_sim.stats()["by_path"].get(route, 0)
    with node.client() as c:
        r = c.post(route, json={"model": "llama3.2:3b", "stream": stream,
                                "messages": [{"role": "user", "content": "hi"}]})
    assert r.headers.get("x-hub-pool-served-by") == "local", (r.status_code, r.text)  # the engine answered
    assert ollama_sim.stats()["by_path"].get(route, 0) == before + 1
    with node.client(headers=node.headers()) as c:
        rows = c.get("/api/inference/pool/routing-log?limit=5").json()["entries"]
    assert next(e for e in rows if e["id"] == r.headers["x-hub-pool-request-id"])["stream"] is streams
