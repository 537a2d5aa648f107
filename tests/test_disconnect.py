"""A client that hangs up makes the node abort its upstream request (spec: Client hang-ups)."""

from __future__ import annotations

import httpx
import pytest
from harness import RunningNode, wait_until

from hubpool_sim import SimConfig, SimModel, run_in_thread


@pytest.fixture
def slow_sim():
    cfg = SimConfig(flavor="ollama", models=[SimModel("llama3.2:3b", window=8192)], decode_ms_per_token=50)
    with run_in_thread(cfg) as sim:
        yield sim


@pytest.mark.parametrize("route,body", [
    ("/api/chat", {"messages": [{"role": "user", "content": "tell me a long story"}], "options": {"num_predict": 400}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "long"}], "stream": True, "max_tokens": 400}),
])
def test_hang_up_mid_stream_aborts_upstream(tmp_path, slow_sim, route, body):
    with RunningNode(tmp_path / "n", {"OLLAMA_URL": slow_sim.url}) as node:
        with httpx.Client(base_url=node.url, timeout=30) as c:
            with c.stream("POST", route, json={"model": "llama3.2:3b", **body}) as r:
                assert r.status_code == 200
                rid = r.headers["x-hub-pool-request-id"]
                next(r.iter_raw())  # the stream is flowing
            # leaving the block closes the connection mid-stream
        assert wait_until(lambda: slow_sim.stats()["aborted"] >= 1), slow_sim.stats()
        with node.client(headers=node.headers()) as c:
            assert wait_until(lambda: next(
                e for e in c.get("/api/inference/pool/routing-log").json()["entries"] if e["id"] == rid
            )["clientClosed"] is True)


def test_hang_up_before_headers_aborts_upstream_and_is_not_failed_over(tmp_path, slow_sim):
    slow_sim.add_fault("hang", count=1)
    with RunningNode(tmp_path / "n", {"OLLAMA_URL": slow_sim.url}) as node:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(node.url + "/api/chat", json={"model": "llama3.2:3b", "messages": []}, timeout=1.0)
        assert wait_until(lambda: slow_sim.stats()["aborted"] >= 1), slow_sim.stats()
        with node.client(headers=node.headers()) as c:
            entries = c.get("/api/inference/pool/routing-log").json()["entries"]
        row = entries[0]
        assert row["clientClosed"] is True and row["outcome"] == "failed"
        assert row["status"] is None and row["node"] == "local" and row["attempt"] == 1
        assert row["failedOverFrom"] == []
