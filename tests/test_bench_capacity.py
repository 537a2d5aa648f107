"""`hubpool bench capacity` through a running node on the simulator: the simulator holds two
slots and spends 20 ms a token, so at 4 concurrent half the streams wait a whole answer
(about 320 ms) for a slot: a time-to-first-token SLO of 150 ms at p75 must break at 4 and
hold at 2 (p75, not p95: one stray slow stream on a loaded machine is not what is tested).

The node and the simulator are processes of their own (`hubpool serve`, `hubpool-sim`), as
an operator runs them: in this process they would share its interpreter lock and garbage
collector with whatever a long test session left behind, and a pause there shows up as
time to first token (CI saw two streams at 615 ms in one level of a full run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest
from aiohttp import web
from aiohttp_thread import ThreadedApp
from process_harness import NodeProcess, SimProcess, free_port

MODEL = "cap:1b"
SLOTS = 2
TOKENS = 16
MS_PER_TOKEN = 20


def _capacity(url: str, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUB_POOL_")}
    return subprocess.run([sys.executable, "-m", "hubpool_core.cli", "bench", "capacity", "--url", url,
                           "--model", MODEL, *extra], capture_output=True, text=True, timeout=90, env=env)


@pytest.fixture
def node_on_sim(tmp_path):
    sim = SimProcess("engine", tmp_path, ["--flavor", "ollama", "--model", MODEL, "--slots", str(SLOTS),
                                          "--tokens", str(TOKENS), "--decode-ms-per-token", str(MS_PER_TOKEN)])
    node = NodeProcess("hub-a", tmp_path, free_port(), {"OLLAMA_URL": sim.url,
                                                        "HUB_POOL_TAILSCALE_CLI": "/nonexistent/tailscale"})
    try:
        sim.start()
        node.start(ready_timeout=40)
        yield node, sim
    finally:
        node.stop()
        sim.kill()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/api/chat"])
def test_capacity_is_the_last_level_within_the_slo(node_on_sim, route):
    node, _sim = node_on_sim
    done = _capacity(node.url, "--route", route, "--slo-ttft-ms", "150", "--percentile", "75", "--levels", "1,2,4,8",
                     "--max-concurrency", "8", "--duration", "1.5", "--max-tokens", str(TOKENS), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["capacity"] == SLOTS and report["brokeAt"] == 4, json.dumps(report["steps"])
    levels = [s["concurrency"] for s in report["steps"]]
    assert levels == [1, 2, 4]  # it stops at the first level that breaks
    ok, broke = report["steps"][1], report["steps"][2]
    assert ok["metSlo"] and ok["failed"] == 0 and ok["requests"] >= 4 and ok["ttftP75Ms"] <= 150
    # the broken level's wait is a slot's worth of decoding, not noise
    assert not broke["metSlo"] and broke["ttftP75Ms"] >= TOKENS * MS_PER_TOKEN * 0.7
    assert report["prompts"] == "unique"
    # every request went through the node: its routing log has them, served
    with httpx.Client(base_url=node.url, headers=node.headers(), timeout=10, trust_env=False) as c:
        summary = c.get("/api/inference/pool/routing-log?limit=1").json()["summary"]
    assert summary["served"] >= sum(s["requests"] for s in report["steps"]) and summary["failed"] == 0


def _recorder(prompts: list[str]) -> web.Application:
    """A streaming engine that keeps every prompt it is sent (the simulator does not say)."""

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompts.append(body["prompt"])
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        await resp.write(b'{"response":"hi","done":false}\n{"response":"","done":true}\n')
        return resp

    app = web.Application()
    app.router.add_post("/api/generate", generate)
    return app


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shared", [True, False])
def test_shared_prefix_sends_byte_identical_prompts_and_the_default_unique_ones(shared):
    seen: list[str] = []
    with ThreadedApp(_recorder(seen)) as engine:
        done = _capacity(engine.url, "--route", "/api/generate", "--levels", "2",
                         # 2 s, not 0.5: on a busy 2-core CI machine a half-second step sent two requests
                         "--max-concurrency", "2", "--duration", "2", "--prompt-tokens", "64", "--json",
                         *(["--shared-prefix"] if shared else []))
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        prompts = list(seen)
    assert report["prompts"] == ("shared-prefix" if shared else "unique")
    assert len(prompts) == report["steps"][0]["requests"] + 1 >= 5  # the uncounted warm-up request too
    assert all(len(p) >= 64 * 4 for p in prompts)
    if shared:
        assert len(set(prompts)) == 1
    else:
        assert len(set(prompts)) == len(prompts)


@pytest.mark.timeout(90)  # two processes to start, five CLI runs: tens of seconds on a busy 2-core machine
def test_capacity_rejects_bad_options_with_a_sentence(node_on_sim):
    node, _sim = node_on_sim
    done = _capacity(node.url, "--route", "/v1/embeddings")
    assert done.returncode == 2 and "--route must be" in done.stdout and "Traceback" not in done.stderr
    done = _capacity(node.url, "--levels", "1,x")
    assert done.returncode == 2 and "comma-separated" in done.stdout
    done = _capacity(node.url, "--levels", "1,16", "--max-concurrency", "8")
    assert done.returncode == 2 and "between 1 and --max-concurrency" in done.stdout
    # nothing listening, or a model no node has: one sentence, no level tried, no trace
    done = _capacity("http://127.0.0.1:9", "--levels", "1", "--duration", "0.5")
    assert done.returncode == 1 and "the first request" in done.stdout and "Traceback" not in done.stderr
    done = _capacity(node.url, "--model", "nobody:has-it", "--levels", "1", "--duration", "0.5")
    assert done.returncode == 1 and "HTTP 502" in done.stdout and "nobody:has-it" in done.stdout
