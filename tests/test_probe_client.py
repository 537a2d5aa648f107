"""The probes' HTTP client (hubpool_core/probe_http.py): an engine's GET goes through aiohttp
(a quarter of httpx's CPU per request, which at the spec's ``poolProbeSnapshotTtlMs: 0`` sits
in front of every first token), and says exactly what httpx's path says for every answer
and every failure, against real servers on loopback."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import pytest
from aiohttp import web
from harness import RunningNode, closed_port_url
from hubpool_ollama.engine import OllamaEngine

from hubpool_core import EngineConfig
from hubpool_core.engine import JsonAnswer
from hubpool_core.probe_http import FastAnswer, ProbeClient

TIMEOUT_S = 0.5


class Server:
    """A real HTTP server on loopback, one route per kind of answer an engine can give."""

    def __init__(self) -> None:
        self.user_agents: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.port = 0
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        assert ready.wait(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()

        async def tags(request: web.Request) -> web.Response:
            self.user_agents.append(request.headers.get("User-Agent", ""))
            return web.json_response({"models": [{"name": "chat:8b", "model": "chat:8b", "size": 1}]})

        async def chat(request: web.Request) -> web.Response:
            return web.json_response({"id": "x", "object": "chat.completion", "model": "chat:8b",
                                      "choices": [{"index": 0, "finish_reason": "stop",
                                                   "message": {"role": "assistant", "content": "hi"}}]})

        async def text(_r: web.Request) -> web.Response:
            return web.Response(text="<html>not an engine</html>", content_type="text/html")

        async def refused_key(_r: web.Request) -> web.Response:
            return web.json_response({"error": "bad key"}, status=401)

        async def unavailable(_r: web.Request) -> web.Response:
            return web.json_response({"error": {"message": "Loading model"}}, status=503)

        async def redirect(_r: web.Request) -> web.Response:
            raise web.HTTPFound("/api/tags")

        async def hang(_r: web.Request) -> web.Response:
            await asyncio.sleep(30)
            return web.json_response({})

        async def cut(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse(headers={"Content-Length": "100", "Content-Type": "application/json"})
            await response.prepare(request)
            await response.write(b'{"models": [')
            request.transport.close()  # the engine dies mid-answer
            return response

        app.router.add_get("/api/tags", tags)
        app.router.add_post("/api/chat", chat)
        app.router.add_post("/v1/chat/completions", chat)
        for path, handler in (("/text", text), ("/key", refused_key), ("/loading", unavailable),
                              ("/moved", redirect), ("/hang", hang), ("/cut", cut)):
            app.router.add_get(path, handler)
        self.runner = runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        self.loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    def stop(self) -> None:
        async def down() -> None:
            await self.runner.cleanup()
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in rest:  # the /hang handlers, still asleep
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(down(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.stop()


def silent_port() -> tuple[socket.socket, str]:
    """A port that takes the connection (the kernel's backlog) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    return sock, f"http://127.0.0.1:{sock.getsockname()[1]}"


def both_ways(base_url: str, path: str) -> tuple[JsonAnswer, JsonAnswer]:
    """``get_json`` through the probe client and through a plain httpx client, same engine."""
    engine = OllamaEngine(EngineConfig(base_url=base_url))

    async def run() -> tuple[JsonAnswer, JsonAnswer]:
        fast = ProbeClient(timeout=TIMEOUT_S)
        plain = httpx.AsyncClient(timeout=TIMEOUT_S, trust_env=False)
        try:
            return await engine.get_json(fast, path), await engine.get_json(plain, path)
        finally:
            await fast.aclose()
            await plain.aclose()

    return asyncio.run(run())


@pytest.mark.parametrize("path", ["/api/tags", "/text", "/key", "/loading", "/moved", "/nowhere"])
def test_every_answer_reads_the_same_through_either_client(server, path):
    fast, plain = both_ways(server.url, path)
    assert fast == plain
    if path == "/api/tags":
        assert fast.ok and fast.body["models"][0]["name"] == "chat:8b"
    else:
        assert fast.error  # every non-answer is a sentence for the operator


def test_nothing_listening_is_refused_the_same_way():
    fast, plain = both_ways(closed_port_url(), "/api/tags")
    assert fast == plain
    assert fast.running is False and fast.error.startswith("connection refused at ")


def test_a_port_that_never_answers_times_out_the_same_way(server):
    fast, plain = both_ways(server.url, "/hang")
    assert fast == plain
    assert fast.running is not False and "did not answer GET /hang in time" in fast.error


def test_a_silent_listener_is_a_timeout_not_a_crash():
    sock, url = silent_port()
    try:
        fast, plain = both_ways(url, "/api/tags")
    finally:
        sock.close()
    assert fast == plain
    assert "did not answer" in fast.error or "within the probe timeout" in fast.error


def test_an_answer_cut_short_says_something_listened(server):
    fast, plain = both_ways(server.url, "/cut")
    # the transport's own words differ between the libraries; what the operator is told does not
    assert fast.running == plain.running is not False
    assert fast.error.startswith(f"GET {server.url}/cut failed: ")
    assert plain.error.startswith(f"GET {server.url}/cut failed: ")
    assert fast.status is None and plain.status is None


def test_a_node_at_ttl_zero_probes_through_aiohttp(tmp_path, server):
    """Through a running node at the spec's defaults: every request probes its engine live,
    and the probes are the aiohttp client's, not httpx's."""
    server.user_agents.clear()
    with RunningNode(tmp_path / "n", {"OLLAMA_URL": server.url}) as node:
        for _ in range(3):
            answer = httpx.post(node.url + "/v1/chat/completions", timeout=30, trust_env=False,
                                json={"model": "chat:8b", "messages": [{"role": "user", "content": "hi"}]})
            assert answer.status_code == 200, answer.text
    probes = list(server.user_agents)
    assert len(probes) >= 3  # one live probe per request at least
    assert all("aiohttp" in ua and "httpx" not in ua for ua in probes), probes


def test_an_absent_engine_is_told_from_a_listening_one_without_the_stream_machinery():
    """The per-request check of an engine last seen down (local_engines._refused): an
    address refuses at once on loopback; a name still goes the resolver's way."""
    from hubpool_core.signals.local_engines import _refused

    closed = closed_port_url()
    sock, listening = silent_port()
    try:
        assert asyncio.run(_refused(closed)) is True
        assert asyncio.run(_refused(closed.replace("127.0.0.1", "localhost"))) is True
        assert asyncio.run(_refused(listening)) is False
    finally:
        sock.close()


def test_the_busy_load_poll_asks_a_peer_signed_through_aiohttp(tmp_path):
    """Two paired nodes: the busy load poll's call (every poolLoadPollMs while a node is busy)
    goes through aiohttp, signed, the peer verifies it and answers its in-flight count; the
    round trip is kept as that peer's hop. A peer that is gone raises as httpx's call would."""
    from contextlib import ExitStack

    from harness import fqdn, make_pool, meshed

    from hubpool_core.peering.client import PeerClient
    from hubpool_sim import SimConfig, run_in_thread

    with ExitStack() as stack:
        sim = stack.enter_context(run_in_thread(SimConfig(flavor="ollama")))
        nodes = make_pool(tmp_path, ["hub-a", "hub-b"], per_node={n: {"OLLAMA_URL": sim.url} for n in ("hub-a", "hub-b")})
        a, b = meshed(stack, nodes, [])
        row = a.node.peers.by_fqdn(fqdn("hub-b"))
        answer = a.run(a.node.peer_client.get_fast(row, "/api/inference/pool/capabilities", 5.0))
        assert isinstance(answer, FastAnswer)  # aiohttp's path, not httpx's
        assert answer.status_code == 200 and isinstance(answer.json()["inFlightRequests"], int)
        a.node.load.last_acquired = time.monotonic()  # placed just now: busy, so the poll runs
        before = a.node.hops.readings(row.id)
        a.run(a.node.health.load_tick())
        assert a.node.hops.readings(row.id) == min(before + 1, 8) and a.node.hops.wall_ms(row.id) > 0
        gone = PeerClient(a.node)
        gone.base_url = lambda _fqdn: closed_port_url()  # type: ignore[method-assign]
        with pytest.raises(httpx.ConnectError):
            a.run(gone.get_fast(row, "/api/inference/pool/capabilities", 5.0))
        a.run(gone.close())
