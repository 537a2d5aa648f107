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
    """Two candidates (issue 16.12: with one, a walk that failed over on a hang-up passed too):
    whichever is asked first hangs, the app gives up, and the other is never asked."""
    cfg = SimConfig(flavor="vllm", models=[SimModel("llama3.2:3b", window=8192)])
    with run_in_thread(cfg) as other, \
            RunningNode(tmp_path / "n", {"OLLAMA_URL": slow_sim.url, "VLLM_URL": other.url}) as node:
        sims = {"ollama": (slow_sim, "/api/chat"), "vllm": (other, "/v1/chat/completions")}
        for sim, _ in sims.values():
            sim.add_fault("hang", count=1)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(node.url + "/api/chat", json={"model": "llama3.2:3b", "messages": []}, timeout=1.0)
        assert wait_until(lambda: slow_sim.stats()["aborted"] + other.stats()["aborted"] >= 1)
        with node.client(headers=node.headers()) as c:
            row = c.get("/api/inference/pool/routing-log").json()["entries"][0]
        assert row["candidates"] == 2  # a second candidate was there to fail over to
        assert row["clientClosed"] is True and row["outcome"] == "failed"
        assert row["status"] is None and row["node"] == "local" and row["attempt"] == 1
        assert row["failedOverFrom"] == [] and row["attempts"] == []
        asked = {kind: sim.stats()["by_path"].get(path, 0) for kind, (sim, path) in sims.items()}
        assert asked == {row["backend"]: 1, ({"ollama", "vllm"} - {row["backend"]}).pop(): 0}, asked
