"""What a node adds before the first token at the spec's ``poolProbeSnapshotTtlMs: 0`` (issue 27,
"a few milliseconds"; docs/performance.md): an engine that is not there is not asked its agent
routes on every request, and a peer serving a forward does not wait for a probe of its engine
(the sender already chose it) — it serves from the engine's last healthy answer."""

from __future__ import annotations

import asyncio
import threading

import httpx
from harness import RunningNode, make_pool, poll_until_offered, wait_until
from harness import pair as pair_nodes

from hubpool_sim import SimConfig, SimModel, run_in_thread
from hubpool_sim.server import ThreadedSimServer

MODEL = "chat:8b"


class HealthGate:
    """A TCP hop in front of an engine that holds every ``GET /health`` while closed (a probe
    that does not come back), passing everything else through, and keeps the GETs' paths:
    the world, not the code. A new connection goes to ``upstream_port`` as it is then."""

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.open = threading.Event()
        self.open.set()
        self.held = 0
        self.gets: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.port = 0
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._conn, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)

        async def down() -> None:
            while data := await up_r.read(65536):
                writer.write(data)
                await writer.drain()
            writer.close()

        task = asyncio.ensure_future(down())
        try:
            while data := await reader.read(65536):
                if data.startswith(b"GET "):
                    self.gets.append(data.split(b" ", 2)[1].decode())
                if data.startswith(b"GET /health ") and not self.open.is_set():
                    self.held += 1
                    while not self.open.is_set():
                        await asyncio.sleep(0.02)
                    self.held -= 1
                up_w.write(data)
                await up_w.drain()
        except ConnectionError:
            pass
        finally:
            up_w.close()
            task.cancel()

    def stop(self) -> None:
        self.open.set()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def ask(node: RunningNode, timeout: float = 60.0, model: str = MODEL) -> httpx.Response:
    return httpx.post(node.url + "/v1/chat/completions", timeout=timeout, trust_env=False,
                      json={"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})


def test_a_forward_is_served_from_the_engines_last_answer_while_its_probe_is_held(tmp_path):
    with run_in_thread(SimConfig(flavor="llamacpp", slots=2, models=[SimModel(MODEL)])) as sim:
        gate = HealthGate(int(sim.url.rsplit(":", 1)[1]))
        nodes = make_pool(tmp_path, ["hub-a", "hub-b"], environ={"HUB_POOL_DEV_HEALTH_POLL_SECONDS": "1"},
                          per_node={"hub-b": {"LLAMACPP_URL": gate.url}})
        for n in nodes.values():
            n.start()
        a, b = nodes["hub-a"], nodes["hub-b"]
        try:
            pair_nodes(a, b)
            poll_until_offered(a, [b], MODEL)
            assert a.node.settings.current.poolProbeSnapshotTtlMs == 0  # the spec's default: live probes
            first = ask(a)
            assert first.status_code == 200 and first.headers["x-hub-pool-served-by"].startswith("hub-b")
            gate.open.clear()  # from now on every probe of hub-b's engine hangs at /health
            r = ask(a)
            # answered with hub-b's engine unable to answer a probe: the forward did not wait for
            # one (before, it waited the probe out and answered 502)
            assert r.status_code == 200, r.text
            assert r.headers["x-hub-pool-served-by"].startswith("hub-b")
        finally:
            gate.open.set()
            for n in nodes.values():
                n.stop()
            gate.stop()


def test_an_absent_engine_is_not_asked_its_agent_routes_on_every_request(tmp_path, monkeypatch):
    """At TTL 0 every request probes every engine; an engine that refused the connection was
    also asked its agent routes beside each probe (three more refused connections, cancelled),
    most of what the read cost. Asked once the engine is seen answering."""
    from hubpool_llamacpp.engine import LlamacppEngine

    asked: list[str] = []
    real = LlamacppEngine.agent_dialects

    async def counting(self, http):  # the engine is absent: count what the node tries
        asked.append(self.base_url)
        return await real(self, http)

    monkeypatch.setattr(LlamacppEngine, "agent_dialects", counting)
    with run_in_thread(SimConfig(flavor="ollama", models=[SimModel(MODEL)])) as sim:
        # LLAMACPP_URL is left at a closed port (the harness's default for every engine)
        with RunningNode(tmp_path / "n", {"OLLAMA_URL": sim.url}) as node:
            assert wait_until(lambda: ask(node).status_code == 200, timeout=30)
            before = len(asked)
            for _ in range(5):
                assert ask(node).status_code == 200
            assert len(asked) - before == 0, asked


def test_at_ttl_0_an_engine_gone_since_the_last_request_is_not_tried(tmp_path):
    """At TTL 0 the live probe decides, not the engine's last answer: an engine that served the
    last request and is gone by this one is not tried. The request is refused as having no
    candidate, not sent to the stopped engine and failed (the test a ranking made on the last
    answers beside the probes must pass: docs/performance.md, "Issue 27: ranking beside the
    live probe, tried and not kept")."""
    sim = ThreadedSimServer(SimConfig(flavor="llamacpp", slots=2, models=[SimModel(MODEL)])).start()
    try:
        with RunningNode(tmp_path / "n", {"LLAMACPP_URL": sim.url}) as node:
            assert node.node.settings.current.poolProbeSnapshotTtlMs == 0
            assert wait_until(lambda: ask(node).status_code == 200, timeout=30)
            assert ask(node).status_code == 200
            sim.stop()
            r = ask(node)
            assert r.status_code == 502, r.text
            with node.client(headers=node.headers()) as c:
                row = c.get("/api/inference/pool/routing-log", params={"limit": 1}).json()["entries"][0]
            assert row["outcome"] == "failed"
            assert row["reason"] == "no candidate", row  # not "fetch failed (ECONNREFUSED)"
    finally:
        sim.stop()


def test_at_ttl_0_a_steady_llama_server_is_probed_with_one_get_and_a_swap_is_seen(tmp_path):
    """At TTL 0 every request probes llama-server live; once it has been listed, the probe is
    ``GET /props`` alone while that names the same model file, alias and build (one of the
    three GETs a request paid on a pool bench box; docs/performance.md). A server restarted on
    the same address with another model is listed again on the next request."""
    first = ThreadedSimServer(SimConfig(flavor="llamacpp", slots=2, models=[SimModel(MODEL)])).start()
    second = ThreadedSimServer(SimConfig(flavor="llamacpp", slots=2, models=[SimModel("other:4b")])).start()
    gate = HealthGate(first.port)
    try:
        with RunningNode(tmp_path / "n", {"LLAMACPP_URL": gate.url}) as node:
            assert node.node.settings.current.poolProbeSnapshotTtlMs == 0
            assert wait_until(lambda: ask(node).status_code == 200, timeout=30)
            assert ask(node).status_code == 200
            gate.gets.clear()
            for _ in range(5):
                assert ask(node).status_code == 200
            asked = list(gate.gets)
            assert asked.count("/props") >= 5, asked  # live, once per request
            assert "/v1/models" not in asked and "/health" not in asked, asked
            gate.upstream_port = second.port  # the same address, a server started with another model
            first.stop()
            assert wait_until(lambda: ask(node, model="other:4b").status_code == 200, timeout=30)
            assert ask(node).status_code in (404, 502)  # the old model is no longer offered
    finally:
        gate.stop()
        first.stop()
        second.stop()
