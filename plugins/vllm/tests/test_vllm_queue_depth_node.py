"""vLLM's own queue depth in placement, through running nodes: a vLLM answering from
recorded bodies (vLLM itself cannot run here) on a real socket behind hub-a, a simulated
vLLM behind hub-b. Only with ``poolEngineQueueDepth`` on does hub-a see the work its
engine took from elsewhere."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from harness import fqdn, make_pool, pair

from hubpool_sim import SimConfig, SimModel, run_in_thread

DATA = Path(__file__).parent / "data"
P = "/api/inference/pool"
MODEL = "Qwen/Qwen3-8B"


class RecordedVllm:
    """GET /v1/models, GET /metrics and POST /v1/chat/completions answered from the
    recorded files; ``metrics`` names the /metrics file served now."""

    def __init__(self) -> None:
        self.metrics = "metrics_idle.txt"
        self.metrics_reads = 0
        recorded = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep pytest's output clean
                pass

            def _send(self, status: int, body: bytes, ctype: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._send(200, (DATA / "models.json").read_bytes(), "application/json")
                elif self.path == "/metrics":
                    recorded.metrics_reads += 1
                    self._send(200, (DATA / recorded.metrics).read_bytes(), "text/plain; version=0.0.4")
                else:
                    self._send(404, b'{"detail":"Not Found"}', "application/json")

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/v1/chat/completions":
                    self._send(200, (DATA / "chat_completion.json").read_bytes(), "application/json")
                else:
                    self._send(404, b'{"detail":"Not Found"}', "application/json")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> RecordedVllm:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def ask(node) -> httpx.Response:
    r = httpx.post(node.url + "/v1/chat/completions", timeout=20,
                   json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert r.status_code == 200, r.text
    return r


def set_depth_setting(node, value: int) -> None:
    with node.client(headers=node.headers()) as c:
        r = c.patch(P + "/settings", json={"poolEngineQueueDepth": value})
    assert r.status_code == 200, r.text
    assert r.json()["poolEngineQueueDepth"] == value


@pytest.fixture
def pool(tmp_path):
    with RecordedVllm() as recorded, \
            run_in_thread(SimConfig(flavor="vllm", models=[SimModel(MODEL, window=32768)])) as sim:
        nodes = make_pool(tmp_path, ["hub-a", "hub-b"],
                          per_node={"hub-a": {"VLLM_URL": recorded.url}, "hub-b": {"VLLM_URL": sim.url}})
        for n in nodes.values():
            n.start()
        try:
            pair(nodes["hub-a"], nodes["hub-b"])
            nodes["hub-a"].run(nodes["hub-a"].node.health.poll_once())
            yield nodes["hub-a"], recorded
        finally:
            for n in nodes.values():
                n.stop()


def test_off_by_default_the_busy_engine_is_not_asked_and_keeps_its_head_start(pool):
    a, recorded = pool
    recorded.metrics = "metrics_busy.txt"  # 3 running + 2 waiting that hub-a never placed
    with a.client(headers=a.headers()) as c:
        assert c.get(P + "/settings").json()["poolEngineQueueDepth"] == 0
    assert ask(a).headers["x-hub-pool-served-by"] == "local"
    assert recorded.metrics_reads == 0  # nothing extra is requested while the setting is off


def test_on_the_engines_own_queue_sends_work_to_an_idle_peer(pool):
    a, recorded = pool
    set_depth_setting(a, 1)
    recorded.metrics = "metrics_idle.txt"
    assert ask(a).headers["x-hub-pool-served-by"] == "local"  # idle: the head start holds
    recorded.metrics = "metrics_busy.txt"
    r = ask(a)
    assert r.headers["x-hub-pool-served-by"] == fqdn("hub-b")  # 5 queued here > 0 there + head start 1
    assert recorded.metrics_reads >= 2
    set_depth_setting(a, 0)
    assert ask(a).headers["x-hub-pool-served-by"] == "local"


def test_metrics_that_say_nothing_leave_the_proxy_count_alone(pool):
    a, recorded = pool
    set_depth_setting(a, 1)
    recorded.metrics = "models.json"  # /metrics answering something that is not Prometheus text
    assert ask(a).headers["x-hub-pool-served-by"] == "local"
    assert recorded.metrics_reads >= 1  # it was asked, and its answer counted for nothing


def test_turning_it_off_takes_effect_even_on_a_cached_probe(pool):
    a, recorded = pool
    with a.client(headers=a.headers()) as c:
        r = c.patch(P + "/settings", json={"poolProbeSnapshotTtlMs": 60_000, "poolEngineQueueDepth": 1})
    assert r.status_code == 200, r.text
    a.node.local.invalidate(a.node.local.engines[[e.kind for e in a.node.local.engines].index("vllm")])
    recorded.metrics = "metrics_busy.txt"
    assert ask(a).headers["x-hub-pool-served-by"] == fqdn("hub-b")
    reads = recorded.metrics_reads
    set_depth_setting(a, 0)
    # the snapshot holding "5 queued" is still fresh for a minute, and no longer counts
    assert ask(a).headers["x-hub-pool-served-by"] == "local"
    assert recorded.metrics_reads == reads
