"""A real llama-server behind hubpool nodes: the official clients, forwarding, slots, the
engine's own timings, its refusals and its death mid-stream, on a generated tiny model.

Every test starts its own llama-server processes (ephemeral ports, ``-np`` slots,
``--metrics``) and real nodes on loopback; nothing here is simulated but the tailnet.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import ollama
import openai
import pytest
from harness import RunningNode, fqdn, make_pool, pair
from hubpool_llamacpp.engine import LlamacppEngine
from real_engine.support import MODEL_ID, REPO

from hubpool_core.engine import EngineConfig
from hubpool_core.testing import run

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(30)]

P = "/api/inference/pool"
HI = [{"role": "user", "content": "hi"}]


def routing_row(node: RunningNode, request_id: str) -> dict:
    with node.client(headers=node.headers()) as c:
        r = c.get(P + "/routing-log")
    assert r.status_code == 200, r.text
    return next(e for e in r.json()["entries"] if e["id"] == request_id)


def settle(node: RunningNode, request_id: str, timeout: float = 10.0) -> dict:
    """The row once it is no longer pending (a stream settles after its last byte)."""
    deadline = time.monotonic() + timeout
    while True:
        row = routing_row(node, request_id)
        if row["outcome"] != "pending" or time.monotonic() > deadline:
            return row
        time.sleep(0.05)


def patch_settings(node: RunningNode, **changes) -> None:
    with node.client(headers=node.headers()) as c:
        r = c.patch(P + "/settings", json=changes)
    assert r.status_code == 200, r.text


def two_nodes(tmp_path, a_env: dict, b_env: dict) -> dict[str, RunningNode]:
    """hub-a and hub-b paired, hub-a having polled hub-b once (so it knows b's models)."""
    nodes = make_pool(tmp_path, ["hub-a", "hub-b"], per_node={"hub-a": a_env, "hub-b": b_env})
    for n in nodes.values():
        n.start()
    try:
        pair(nodes["hub-a"], nodes["hub-b"])
        nodes["hub-a"].run(nodes["hub-a"].node.health.poll_once())
    except BaseException:
        stop_all(nodes)
        raise
    return nodes


def stop_all(nodes: dict[str, RunningNode]) -> None:
    for n in nodes.values():
        n.stop()


# -- the official clients --------------------------------------------------------------


def test_openai_sdk_is_served_by_llama_server(tmp_path, start_llama):
    server = start_llama()
    with RunningNode(tmp_path / "n", {"LLAMACPP_URL": server.url}) as node:
        client = openai.OpenAI(base_url=node.url + "/v1", api_key="unused-inside", max_retries=0)
        assert MODEL_ID in {m.id for m in client.models.list()}

        raw = client.chat.completions.with_raw_response.create(model=MODEL_ID, messages=HI, max_tokens=6)
        assert raw.headers["x-hub-pool-served-by"] == "local"
        assert raw.headers["x-hub-pool-backend"] == "llamacpp"
        completion = raw.parse()
        assert completion.model == MODEL_ID  # llama-server names the model by its --alias
        assert completion.choices[0].finish_reason in ("stop", "length")
        assert completion.usage.prompt_tokens > 0 and 0 < completion.usage.completion_tokens <= 6

        with client.chat.completions.with_streaming_response.create(
                model=MODEL_ID, messages=HI, max_tokens=6, stream=True) as response:
            assert response.headers["x-hub-pool-backend"] == "llamacpp"
            chunks = list(response.parse())
        assert any(c.choices and c.choices[0].finish_reason for c in chunks)
        assert settle(node, response.headers["x-hub-pool-request-id"])["outcome"] == "served"


def test_ollama_client_is_translated_to_llama_server(tmp_path, start_llama):
    server = start_llama()
    with RunningNode(tmp_path / "n", {"LLAMACPP_URL": server.url}) as node:
        seen: list[httpx.Headers] = []
        client = ollama.Client(host=node.url, event_hooks={"response": [lambda r: seen.append(r.headers)]})
        assert MODEL_ID in {m.model for m in client.list().models}

        answer = client.chat(model=MODEL_ID, messages=HI, stream=False, options={"num_predict": 6})
        assert answer.done is True and answer.message.role == "assistant"
        assert answer.eval_count and answer.eval_count <= 6

        parts = list(client.chat(model=MODEL_ID, messages=HI, stream=True, options={"num_predict": 6}))
        assert parts[-1].done is True and all(p.done is False for p in parts[:-1])

        generated = client.generate(model=MODEL_ID, prompt="Once upon", stream=False, options={"num_predict": 4})
        assert generated.done is True
        assert seen and all(h["x-hub-pool-backend"] == "llamacpp" for h in seen if "x-hub-pool-backend" in h)
        assert sum("x-hub-pool-backend" in h for h in seen) >= 3


# -- two nodes ----------------------------------------------------------------------------


def test_the_node_without_the_model_forwards_to_the_one_with_llama_server(tmp_path, start_llama):
    server = start_llama()
    nodes = two_nodes(tmp_path, {}, {"LLAMACPP_URL": server.url})
    a = nodes["hub-a"]
    try:
        client = openai.OpenAI(base_url=a.url + "/v1", api_key="unused-inside", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(model=MODEL_ID, messages=HI, max_tokens=4)
        assert raw.headers["x-hub-pool-served-by"] == fqdn("hub-b")
        assert raw.headers["x-hub-pool-backend"] == "llamacpp"
        assert raw.parse().choices[0].finish_reason in ("stop", "length")
        row = settle(a, raw.headers["x-hub-pool-request-id"])
        assert row["outcome"] == "served" and row["node"] == fqdn("hub-b") and row["failedOverFrom"] == []
    finally:
        stop_all(nodes)


# -- what the engine states about itself ---------------------------------------------------


def test_slot_count_comes_from_the_engine(start_llama):
    server = start_llama(slots=3, ctx=3 * 512)
    slots = httpx.get(server.url + "/slots", timeout=5).json()
    assert len(slots) == 3 and all(s["is_processing"] is False for s in slots)
    engine = LlamacppEngine(EngineConfig(base_url=server.url))

    async def probe():
        async with httpx.AsyncClient(timeout=5, trust_env=False) as http:
            return await engine.probe(http), await engine.queue_depth(http)

    result, depth = run(probe())
    assert result.healthy and result.slots == 3
    [model] = result.models
    assert model.id == MODEL_ID and model.context_window == 512  # -c is split between the slots
    assert depth == 0


def test_queue_depth_counts_running_and_deferred_requests(start_llama):
    server = start_llama(slots=1, ctx=8192)
    engine = LlamacppEngine(EngineConfig(base_url=server.url))
    with DirectLoad(server.url, 2):  # one generating in the only slot, one deferred behind it
        depth = wait_for_depth(engine, 2)
        assert depth == 2
        slots = httpx.get(server.url + "/slots", timeout=5).json()
        assert [s["is_processing"] for s in slots] == [True]
    assert wait_for_depth(engine, 0) == 0


def test_queue_depth_falls_back_to_busy_slots_without_metrics(start_llama):
    server = start_llama(slots=2, ctx=8192, metrics=False)
    assert httpx.get(server.url + "/metrics", timeout=5).status_code != 200
    engine = LlamacppEngine(EngineConfig(base_url=server.url))
    with DirectLoad(server.url, 1):
        assert wait_for_depth(engine, 1) == 1


def test_the_engines_own_timings_feed_the_throughput_samples(tmp_path, start_llama):
    server = start_llama(ctx=4096)
    with RunningNode(tmp_path / "n", {"LLAMACPP_URL": server.url}) as node:
        # ~18 KB of " tttttttt": over the 4,096 estimated tokens a sample needs, while the
        # generated vocabulary reads each word as one token, so ~2,000 fit the window
        body = {"model": MODEL_ID, "max_tokens": 8, "messages": [{"role": "user", "content": " tttttttt" * 2000}]}
        raw = json.dumps(body).encode()
        r = httpx.post(node.url + "/v1/chat/completions", content=raw, timeout=25,
                       headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
        answer = r.json()
        timings = answer["timings"]
        assert timings["prompt_n"] + timings["cache_n"] == answer["usage"]["prompt_tokens"]
        assert timings["prompt_n"] >= 1024  # enough read for the sample to count
        estimated = -(-len(raw) // 4)
        assert estimated >= 4096
        with node.client(headers=node.headers()) as c:
            [entry] = c.get(P + "/status").json()["localNode"]["throughput"]
        assert entry["backend"] == "llamacpp" and entry["model"] == MODEL_ID
        [prefill] = entry["prefill"]
        # the pool's unit, scaled to the part llama-server read, over llama-server's own prompt_ms
        expected = estimated * timings["prompt_n"] / (timings["prompt_n"] + timings["cache_n"]) \
            / (timings["prompt_ms"] / 1000)
        assert prefill["tokensPerSec"] == pytest.approx(expected, rel=1e-3, abs=0.1)
        assert prefill["deadline"] is False
        assert entry["decode"]["tokensPerSec"] == pytest.approx(
            timings["predicted_n"] / (timings["predicted_ms"] / 1000), rel=1e-3, abs=0.1)

        # the same turn again: llama-server serves the prompt from its cache and says so,
        # and a cache hit is not a read, so the prefill evidence stands as it was
        again = httpx.post(node.url + "/v1/chat/completions", content=raw, timeout=25,
                           headers={"content-type": "application/json"}).json()["timings"]
        assert again["cache_n"] > 1024 and again["prompt_n"] < 1024
        with node.client(headers=node.headers()) as c:
            [entry] = c.get(P + "/status").json()["localNode"]["throughput"]
        assert [p["tokensPerSec"] for p in entry["prefill"]] == [prefill["tokensPerSec"]]


# -- refusals are the request's fault ------------------------------------------------------


def test_the_context_size_refusal_is_the_requests_fault_not_a_failover(tmp_path, start_llama):
    small, other = start_llama(ctx=256), start_llama(ctx=256)
    nodes = two_nodes(tmp_path, {"LLAMACPP_URL": small.url}, {"LLAMACPP_URL": other.url})
    a = nodes["hub-a"]
    try:
        long_prompt = [{"role": "user", "content": "abc " * 300}]  # ~1,200 tokens into 256
        r = httpx.post(a.url + "/v1/chat/completions", json={"model": MODEL_ID, "messages": long_prompt},
                       timeout=20)
        assert r.status_code == 400, r.text
        assert "exceeds the available context size" in r.json()["error"]["message"]
        assert r.headers["x-hub-pool-served-by"] == "local"
        row = settle(a, r.headers["x-hub-pool-request-id"])
        assert row["outcome"] == "failed" and row["status"] == 400
        assert row["requestError"]["signature"] == "client-error"
        assert row["failedOverFrom"] == [] and row["attempts"] == [] and row["attempt"] == 1
        assert row["candidates"] == 2  # hub-b held the model too, and was not asked
    finally:
        stop_all(nodes)


def test_a_message_without_content_is_the_requests_fault_not_a_failover(tmp_path, start_llama):
    one, two = start_llama(), start_llama()
    nodes = two_nodes(tmp_path, {"LLAMACPP_URL": one.url}, {"LLAMACPP_URL": two.url})
    a = nodes["hub-a"]
    try:
        r = httpx.post(a.url + "/v1/chat/completions",
                       json={"model": MODEL_ID, "messages": [{"role": "user"}]}, timeout=20)
        assert r.status_code == 400, r.text
        assert "content" in r.json()["error"]["message"].lower()
        row = settle(a, r.headers["x-hub-pool-request-id"])
        assert row["outcome"] == "failed" and row["status"] == 400
        assert row["requestError"]["signature"] == "client-error"
        assert row["failedOverFrom"] == [] and row["attempts"] == [] and row["candidates"] == 2
    finally:
        stop_all(nodes)


# -- death mid-stream --------------------------------------------------------------------


def test_llama_server_killed_mid_stream_is_truncated_upstream(tmp_path, start_llama):
    server = start_llama(ctx=8192)
    with RunningNode(tmp_path / "n", {"LLAMACPP_URL": server.url}) as node:
        body = {"model": MODEL_ID, "messages": HI, "stream": True, "max_tokens": 8000, "ignore_eos": True}
        received = b""
        with httpx.stream("POST", node.url + "/v1/chat/completions", json=body, timeout=20) as r:
            assert r.status_code == 200
            request_id = r.headers["x-hub-pool-request-id"]
            chunks = r.iter_raw()
            received += next(chunks)  # the stream has begun: the engine is generating
            server.kill()
            try:
                for chunk in chunks:
                    received += chunk
            except httpx.HTTPError:
                pass  # the node lets the stream die visibly
        assert b"[DONE]" not in received
        row = settle(node, request_id)
        assert row["outcome"] == "failed"
        assert row["reason"].startswith("truncated-upstream")
        assert row["requestError"]["signature"] == "truncated-upstream"
        assert row["failedOverFrom"] == []


# -- engine-reported queue depth in placement ---------------------------------------------


def test_engine_reported_queue_depth_moves_work_off_a_busy_engine_only_when_on(tmp_path, start_llama):
    busy, idle = start_llama(slots=1, ctx=8192), start_llama(slots=1)
    nodes = two_nodes(tmp_path, {"LLAMACPP_URL": busy.url}, {"LLAMACPP_URL": idle.url})
    a = nodes["hub-a"]
    engine = LlamacppEngine(EngineConfig(base_url=busy.url))
    try:
        # traffic that reached hub-a's engine directly: the proxy's own count never sees it
        with DirectLoad(busy.url, 2):
            assert wait_for_depth(engine, 2) == 2
            patch_settings(a, poolEngineQueueDepth=1)
            r = httpx.post(a.url + "/v1/chat/completions", json={"model": MODEL_ID, "messages": HI, "max_tokens": 4},
                           timeout=20)
            assert r.status_code == 200, r.text
            assert r.headers["x-hub-pool-served-by"] == fqdn("hub-b")  # 2 queued here > 0 there + head start 1

            patch_settings(a, poolEngineQueueDepth=0)
            # off (the default): placement ranks on its own count, sees an idle local engine and
            # queues the request behind the direct work; only where it was placed is read
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(a.url + "/v1/chat/completions", timeout=1.5,
                           json={"model": MODEL_ID, "messages": HI, "max_tokens": 4})
            with a.client(headers=a.headers()) as c:
                newest = c.get(P + "/routing-log").json()["entries"][0]
            assert newest["node"] == "local" and newest["attempt"] == 1
    finally:
        stop_all(nodes)


# -- the plugin's recorded data against the live server ------------------------------------

RECORDED = REPO / "plugins" / "llamacpp" / "tests" / "data"


def recorded(name: str):
    return json.loads((RECORDED / name).read_text())


def metric_names(text: str) -> set[str]:
    return {line.split()[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_the_plugins_recorded_data_has_the_live_servers_shape(start_llama):
    """The captured files are only worth their assertions while the engine still answers in
    their shape: a new llama.cpp that renames a field fails here, not on a user's machine."""
    server = start_llama(slots=2, ctx=2048)  # as capture_llamacpp_data.py starts it
    engine = LlamacppEngine(EngineConfig(base_url=server.url))
    with httpx.Client(base_url=server.url, timeout=10, trust_env=False) as c:
        assert c.get("/health").json() == recorded("health.json")
        live_models, old_models = c.get("/v1/models").json(), recorded("models.json")
        assert set(live_models) == set(old_models)
        assert set(live_models["data"][0]) == set(old_models["data"][0])
        assert live_models["data"][0]["meta"] == old_models["data"][0]["meta"]  # same model, same numbers
        live_props, old_props = c.get("/props").json(), recorded("props.json")
        assert set(live_props) == set(old_props)
        assert live_props["total_slots"] == old_props["total_slots"]
        assert live_props["default_generation_settings"]["n_ctx"] == old_props["default_generation_settings"]["n_ctx"]
        assert [set(s) for s in c.get("/slots").json()] == [set(s) for s in recorded("slots.json")]
        assert metric_names(c.get("/metrics").text) == metric_names((RECORDED / "metrics_busy.txt").read_text())

        chat = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3}
        live, old = c.post("/v1/chat/completions", json=chat).json(), recorded("chat_completion.json")
        assert set(live) == set(old) and set(live["timings"]) == set(old["timings"])
        assert set(live["usage"]) == set(old["usage"])
        assert engine.timings(live).prompt_tokens == live["usage"]["prompt_tokens"]

        for case in recorded("errors_captured.json"):
            body = {"model": MODEL_ID, "messages": [{"role": "user"}]} if case["signature"] == "invalid-message" \
                else {"model": MODEL_ID, "messages": [{"role": "user", "content": "abc " * 600}]}
            r = c.post("/v1/chat/completions", json=body)
            assert r.status_code == case["status"]
            assert r.json()["error"]["message"] == case["body"]["error"]["message"]
            assert engine.request_error(500, r.json()) == case["signature"]


# -- helpers -------------------------------------------------------------------------------


class DirectLoad:
    """``count`` long generations sent straight to llama-server (not through a node), each
    held open in a thread until the block ends; closing them makes llama-server stop."""

    def __init__(self, url: str, count: int) -> None:
        self.url, self.count = url, count
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def _one(self) -> None:
        body = {"model": MODEL_ID, "messages": HI, "stream": True, "max_tokens": 6000, "ignore_eos": True}
        try:
            with httpx.stream("POST", self.url + "/v1/chat/completions", json=body, timeout=30) as r:
                for _ in r.iter_raw():
                    if self.stop.is_set():
                        return
        except httpx.HTTPError:
            return

    def __enter__(self) -> DirectLoad:
        for _ in range(self.count):
            t = threading.Thread(target=self._one, daemon=True)
            t.start()
            self.threads.append(t)
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)


def wait_for_depth(engine: LlamacppEngine, want: int, timeout: float = 8.0) -> int | None:
    """The engine's reported depth once it equals ``want`` (or the last reading at timeout)."""

    async def read():
        async with httpx.AsyncClient(timeout=5, trust_env=False) as http:
            return await engine.queue_depth(http)

    deadline = time.monotonic() + timeout
    while True:
        depth = run(read())
        if depth == want or time.monotonic() > deadline:
            return depth
        time.sleep(0.05)


# -- what predicted time to first token reads (docs/placement.md) -----------------------------


def test_residency_slots_and_speed_of_a_real_llama_server_reach_the_peer(tmp_path, start_llama):
    """The real engine's memory state (a classic server holds its one model while it answers),
    its slot count and its timed speed, advertised by the node beside it to the entry node."""
    server = start_llama(slots=2, ctx=4096)
    nodes = two_nodes(tmp_path, {}, {"LLAMACPP_URL": server.url})
    a, b = nodes["hub-a"], nodes["hub-b"]
    try:
        b.run(b.node.residency_sampler.sample())
        prompt = [{"role": "user", "content": "hello " * 50}]
        r = httpx.post(a.url + "/v1/chat/completions", json={"model": MODEL_ID, "messages": prompt,
                                                             "max_tokens": 4}, timeout=30)
        assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] == fqdn("hub-b")
        a.run(a.node.health.poll_once())
        with a.client(headers=a.headers()) as c:
            peer = next(p for p in c.get(P + "/status").json()["peers"] if p["nodeFqdn"] == fqdn("hub-b"))
        caps = peer["lastCapabilities"]
        assert {"backend": "llamacpp", "models": [MODEL_ID]} in caps["resident"]
        assert {"backend": "llamacpp", "slots": 2} in caps["engineSlots"]
        spoken = {(s["backend"], s["model"]): s for s in caps["speed"]}
        assert spoken[("llamacpp", MODEL_ID.lower())]["prefillTps"] > 0  # from llama-server's own timings
        # the entry node timed the forward from the same timings, and would rank with it
        assert a.node.speed.get(fqdn("hub-b"), "llamacpp", MODEL_ID).prefill_tps > 0
        assert peer["resident"] == caps["resident"]
    finally:
        stop_all(nodes)
