"""What the `hubpool serve` process does for its memory and its writes (docs/performance.md):
the serve arguments are read without typer, alembic runs in a child only when the schema is
behind, and a held answer's head and body leave in one write while a stream's head still goes
out before its first token."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
import uvicorn
from harness import ENGINE_VARS, closed_port_url

from hubpool_core.bench import procs
from hubpool_core.bench.stub_engine import FAST, PACED
from hubpool_core.cli.main import serve_arguments
from hubpool_core.config import EnvSettings
from hubpool_core.node.node import Node
from hubpool_core.node.server import make_config
from hubpool_core.store.db import Database, head_revision, migrate_apart


@pytest.mark.parametrize("argv, expected", [
    (["serve"], {}),
    (["serve", "--listen", "0.0.0.0:5002"], {"--listen": "0.0.0.0:5002"}),
    (["serve", "--log-level=debug", "--listen=127.0.0.1:9"], {"--log-level": "debug", "--listen": "127.0.0.1:9"}),
    (["serve", "--help"], None),            # typer answers it
    (["serve", "--listen"], None),          # typer says the value is missing
    (["serve", "--listen", "a", "--listen", "b"], None),
    (["serve", "--bogus", "x"], None),
    (["status"], None),
    ([], None),
])
def test_serve_arguments_are_read_only_when_they_are_exactly_serves(argv, expected):
    assert serve_arguments(argv) == expected


def _fresh_python(code: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_entry_point_does_not_load_typer_until_a_command_needs_it():
    out = _fresh_python("import sys, hubpool_core.cli.main as m\n"
                        "print('typer' in sys.modules, 'rich' in sys.modules, 'httpx' in sys.modules)\n"
                        "m.__getattr__('app')\nprint('typer' in sys.modules)")
    assert out.splitlines() == ["False False True", "True"]


def test_a_current_schema_is_not_migrated_with_alembic_and_a_behind_one_is_migrated_apart(tmp_path):
    url = f"sqlite:///{tmp_path / 'hubpool.db'}"
    assert head_revision() == "0002"  # 0002: the routing history's table (docs/upgrades.md)
    assert migrate_apart(url) is True  # a new database: the child ran alembic
    db = Database(url)
    try:
        assert db.current_revision() == head_revision()
        tables = {r[0] for r in db.engine.connect().exec_driver_sql(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {"hub_pool_identity", "hub_pool_peer", "hub_pool_api_key", "hub_pool_routing_history",
                "alembic_version"} <= tables
    finally:
        db.dispose()
    out = _fresh_python("import sys\nfrom hubpool_core.store.db import Database\n"
                        f"db = Database({url!r}); db.migrate(); print('alembic' in sys.modules)")
    assert out == "False"
    assert migrate_apart("sqlite://") is False  # in memory: only the process itself can migrate it


#: modules a serving node never needs, each MBs resident (G7, docs/performance.md step 10)
NEVER_IN_A_NODE = ("sqlalchemy.orm", "jinja2", "websockets", "hubpool_sim.server", "aiohttp.web", "alembic",
                   "typer", "rich")


def test_a_served_node_never_loads_the_sqlalchemy_orm_or_other_unneeded_frameworks(tmp_path):
    """The store is Core only: the ORM would cost about 6 MB resident per node (G7). Nor do the
    web UI's templates (loaded on the first page), uvicorn's WebSocket implementations (no
    WebSocket route), the simulator's server (its plugin only adds `hubpool demo`), alembic
    (a child runs it) or the CLI's typer and rich become resident."""
    env = {v: closed_port_url() for v in ENGINE_VARS}
    env.update({"HUB_POOL_DATA_DIR": str(tmp_path / "node"), "HUB_POOL_LISTEN": "127.0.0.1:9",
                "HUB_POOL_TAILSCALE_CLI": "/nonexistent/tailscale"})
    # as run_node builds it, then a pass over every table the node reads and writes
    out = _fresh_python(
        "import os, sys\n"
        "from hubpool_core.config import EnvSettings\n"
        "from hubpool_core.node.node import Node\n"
        "from hubpool_core.node.server import make_config\n"
        "from hubpool_core.store.db import migrate_apart\n"
        "env = EnvSettings.from_environ(os.environ)\n"
        "env.data_dir.mkdir(parents=True, exist_ok=True)\n"
        "assert migrate_apart(env.resolved_database_url())\n"
        "node = Node(env)\n"
        "make_config(env, node, 'warning').load()\n"
        "assert node.identity.get() is not None\n"
        "node.peers.all(); node.peers.expire_pending(); node.keys.list(); node.keys.resolve('hpi_nope')\n"
        f"print('sqlalchemy' in sys.modules, [m for m in {NEVER_IN_A_NODE!r} if m in sys.modules])", env)
    assert out == "True []"


@pytest.fixture
def served(tmp_path):
    """A node under make_config (the protocol `hubpool serve` runs) in front of the bench stub."""
    started = procs.Started(tmp_path)
    stub_url, _ = procs.start_stub(started, 300.0, 3)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    data = tmp_path / "node"
    data.mkdir()
    (data / "settings.json").write_text(json.dumps(procs.BENCH_SETTINGS))
    env = {v: closed_port_url() for v in ENGINE_VARS}
    env.update({"OLLAMA_URL": stub_url, "HUB_POOL_DATA_DIR": str(data), "HUB_POOL_LISTEN": f"127.0.0.1:{port}",
                "HUB_POOL_TAILSCALE_CLI": "/nonexistent/tailscale"})
    settings = EnvSettings.from_environ(env)
    node = Node(settings)
    config = make_config(settings, node, "warning")
    config.loop = "asyncio"  # a thread of the test process, as the harness runs nodes
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.02)
    try:
        yield port, node.keys.operator_key
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()
        started.stop_all()


def _post(port: int, path: str, body: dict, key: str) -> socket.socket:
    raw = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer %s\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (path.encode(), key.encode(), len(raw), raw))
    return s


class _Recorder:
    """The real transport, with every write kept."""

    def __init__(self, transport, writes):
        self._t, self.writes = transport, writes

    def write(self, data):
        self.writes.append(bytes(data))
        self._t.write(data)

    def __getattr__(self, name):
        return getattr(self._t, name)


def test_a_held_answer_leaves_in_one_write_and_a_stream_head_goes_with_its_first_token(served, monkeypatch):
    port, key = served
    import hubpool_core.node.server as server_module

    writes: list[bytes] = []
    real = server_module.HeadWithBody

    class Recording(real):
        __slots__ = ()

        def __init__(self, transport, loop):
            super().__init__(_Recorder(transport, writes), loop)

    monkeypatch.setattr(server_module, "HeadWithBody", Recording)
    with _post(port, "/v1/chat/completions", {"model": FAST, "messages": [{"role": "user", "content": "x"}]},
               key) as s:
        got = b""
        while not got.endswith(b"0\r\n\r\n"):
            chunk = s.recv(65536)
            assert chunk, got
            got += chunk
    assert got.startswith(b"HTTP/1.1 200 ") and b"x-hub-pool-served-by" in got.lower()
    assert writes == [got]  # head and body in one write

    stream = {"model": PACED, "messages": [{"role": "user", "content": "x"}], "stream": True}
    # poolStreamFirstToken 1 (the default): the head is committed at the first real token (300 ms
    # in), and leaves in the same write as that token
    writes.clear()
    with _post(port, "/v1/chat/completions", stream, key) as s:
        sent = time.monotonic()
        first = s.recv(65536)
        waited = time.monotonic() - sent
        assert first.startswith(b"HTTP/1.1 200 ") and b"x-hub-pool-served-by" in first.lower()
        assert b'"content":"tok "' in first, first
        assert waited >= 0.25, waited
        assert writes and writes[0] == first
    # poolStreamFirstToken 0: the head is committed at the engine's headers and does not wait
    r = httpx.patch(f"http://127.0.0.1:{port}/api/inference/pool/settings", json={"poolStreamFirstToken": 0},
                    headers={"Authorization": f"Bearer {key}"}, trust_env=False)
    assert r.status_code == 200, r.text
    writes.clear()
    with _post(port, "/v1/chat/completions", stream, key) as s:
        sent = time.monotonic()
        first = s.recv(65536)
        waited = time.monotonic() - sent
        assert first.startswith(b"HTTP/1.1 200 ")
        assert b"data:" not in first  # the head came on its own, before the first 300 ms token
        assert waited < 0.25, waited
        assert writes and writes[0] == first


def test_head_with_body_keeps_order_and_never_holds_a_head_past_the_loop_turn():
    import asyncio

    from hubpool_core.node.server import HeadWithBody

    class Sink:
        def __init__(self):
            self.writes, self.closed = [], False

        def write(self, data):
            self.writes.append(data)

        def is_closing(self):
            return self.closed

        def close(self):
            self.closed = True

    async def scenario():
        sink = Sink()
        t = HeadWithBody(sink, asyncio.get_running_loop())
        t.write(b"HTTP/1.1 200 OK\r\na: b\r\n\r\n")
        assert sink.writes == []
        t.write(b"body")
        assert sink.writes == [b"HTTP/1.1 200 OK\r\na: b\r\n\r\nbody"]
        t.write(b"HTTP/1.1 200 OK\r\n\r\n")
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert sink.writes[-1] == b"HTTP/1.1 200 OK\r\n\r\n"  # flushed by the next loop turn
        t.write(b"plain")
        assert sink.writes[-1] == b"plain"
        t.write(b"HTTP/1.1 404 Not Found\r\n\r\n")
        t.close()
        assert sink.writes[-1] == b"HTTP/1.1 404 Not Found\r\n\r\n" and sink.closed
        assert t.is_closing()  # everything else is the real transport's

    asyncio.run(scenario())
