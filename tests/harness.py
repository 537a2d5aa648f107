"""Real nodes for tests: uvicorn on an ephemeral loopback port, in a thread of the test
process, with its own data directory and environment. The code under test is the code
that ships; only the world (engines, tailnet) is simulated."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from hubpool_core.config import EnvSettings
from hubpool_core.node.app import create_app
from hubpool_core.node.node import Node

#: engine URL variables pointed at a closed port unless a test names them, so a test
#: never reaches an engine that happens to run on this machine
ENGINE_VARS = ("OLLAMA_URL", "VLLM_URL", "LLAMACPP_URL", "LEMONADE_URL", "OMLX_URL")


def bound_socket() -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # bound then released: nothing listens there


def wait_until(predicate: Any, timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` seconds pass; its last answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


class RunningNode:
    def __init__(self, data_dir: Path, environ: dict[str, str] | None = None,
                 extra_plugins: tuple[tuple[str, Any], ...] = (), sock: socket.socket | None = None):
        self.sock = sock or bound_socket()
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        dead = closed_port_url()
        env = {var: dead for var in ENGINE_VARS}
        env.update({"HUB_POOL_DATA_DIR": str(data_dir), "HUB_POOL_LISTEN": f"127.0.0.1:{self.port}",
                    "HUB_POOL_TAILSCALE_CLI": "/nonexistent/tailscale",
                    # a Docker daemon on the test machine must not become a node's container source
                    "HUB_POOL_DOCKER_SOCKET": "/nonexistent/docker.sock"})
        env.update(environ or {})
        self.environ = env
        self.env = EnvSettings.from_environ(env)
        self.node = Node(self.env, extra_plugins=extra_plugins)
        config = uvicorn.Config(create_app(self.node), loop="asyncio", http="httptools", log_level="warning",
                                access_log=False, lifespan="on", timeout_graceful_shutdown=5,
                                proxy_headers=False)  # as server.make_config
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def operator_key(self) -> str:
        return self.node.keys.operator_key

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.operator_key}"}

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30, trust_env=False, **kwargs)

    def start(self) -> RunningNode:
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("node did not start")
            time.sleep(0.01)
        return self

    def run(self, coro: Any, timeout: float = 30) -> Any:
        """Run a coroutine on the node's own event loop (its clients live there)."""
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, self.node.loop).result(timeout)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()

    def restarted(self) -> RunningNode:
        """Stop this node and start its data directory again on the same port (where its peers
        know it), as `hubpool serve` would after a reboot; returns the new, running node."""
        self.stop()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        return RunningNode(self.env.data_dir, self.environ, sock=sock).start()

    def __enter__(self) -> RunningNode:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# -- several nodes on one machine -----------------------------------------------------

DATA = Path(__file__).parent / "data"
SUFFIX = "example-tailnet.ts.net"


def tailnet_status_for(name: str) -> dict[str, Any]:
    """The recorded `tailscale status --json` answer, as the node `name` would see it."""
    status = json.loads((DATA / "tailscale_status.json").read_text())
    everyone = {status["Self"]["HostName"]: status["Self"], **{p["HostName"]: p for p in status["Peer"].values()}}
    me = everyone.pop(name)
    status["Self"] = me
    status["CertDomains"] = [me["DNSName"].rstrip(".")]  # a daemon lists its own name's certificate
    status["Peer"] = {f"nodekey:{peer['HostName']}": peer for peer in everyone.values()}
    return status


def fqdn(name: str) -> str:
    return f"{name}.{SUFFIX}"


def make_pool(root: Path, names: list[str], environ: dict[str, str] | None = None,
              per_node: dict[str, dict[str, str]] | None = None) -> dict[str, RunningNode]:
    """Nodes hub-a, hub-b, ... on loopback: each its own data directory and recorded tailnet
    answer, every peer reachable through HUB_POOL_PEER_URLS. Not started."""
    socks = {name: bound_socket() for name in names}
    urls = {fqdn(n): f"http://127.0.0.1:{s.getsockname()[1]}" for n, s in socks.items()}
    nodes = {}
    for name in names:
        status_file = root / f"{name}-tailscale.json"
        status_file.write_text(json.dumps(tailnet_status_for(name)))
        env = {"HUB_POOL_TAILSCALE_CLI": str(status_file), "HUB_POOL_PEER_URLS": json.dumps(urls)}
        env.update(environ or {})
        env.update((per_node or {}).get(name, {}))
        nodes[name] = RunningNode(root / name, env, sock=socks[name])
    return nodes


def name_of(node: RunningNode) -> str:
    """A make_pool node's tailnet name (its data directory is named after it)."""
    return fqdn(node.env.data_dir.name)


def poll_until_offered(node: RunningNode, peers: list[RunningNode], model: str, timeout: float = 30.0) -> None:
    """Poll ``node``'s peers until each of ``peers`` is connected and offers ``model`` on a
    healthy engine. One poll is not always enough on a loaded machine: a peer whose first
    engine probe misses its 500 ms budget answers that poll with no engines (and the right
    answer on the next), which is the product working as designed, not what a test is about."""
    want = {name_of(p) for p in peers}
    deadline = time.monotonic() + timeout
    while True:
        node.run(node.node.health.poll_once())
        with node.client(headers=node.headers()) as c:
            seen = {p["nodeFqdn"]: p for p in c.get("/api/inference/pool/status").json()["peers"]}
        missing = [f for f in want if not (f in seen and seen[f]["status"] == "connected" and any(
            b.get("healthy") and model in (b.get("modelsLoaded") or [])
            for b in (seen[f].get("lastCapabilities") or {}).get("backends") or []))]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{name_of(node)}: {missing} not offering {model} within {timeout}s")
        time.sleep(0.2)


def pair(requester: RunningNode, approver: RunningNode, pin: bool = True) -> None:
    """Pair two running nodes as an operator does: a PIN minted on the approver (optional),
    the request sent from the requester, the approval given on the approver."""
    body: dict[str, Any] = {"nodeFqdn": name_of(approver)}
    with approver.client(headers=approver.headers()) as c:
        if pin:
            r = c.post("/api/inference/pool/pairing-pin")
            assert r.status_code == 200, r.text
            body["pin"] = r.json()["pin"]
    with requester.client(headers=requester.headers()) as c:
        r = c.post("/api/inference/pool/peers/pair", json=body)
        assert r.status_code == 200, r.text
    with approver.client(headers=approver.headers()) as c:
        r = c.post(f"/api/inference/pool/peers/{name_of(requester)}/approve")
        assert r.status_code == 200, r.text


def affinity_pool(stack: Any, root: Path, engines: dict[str, str], model: str,
                  max_in_flight: int = 3) -> dict[str, RunningNode]:
    """hub-a, an entry holding no engine, paired with a node per entry of ``engines`` (name ->
    its llama-server's URL) that offers ``model``; prefix affinity on at the entry
    (``poolPrefixAffinityMaxInFlight``). Every node is entered into ``stack`` (an ExitStack)."""
    nodes = make_pool(root, ["hub-a", *engines], per_node={n: {"LLAMACPP_URL": url} for n, url in engines.items()})
    for n in nodes.values():
        stack.enter_context(n)
    entry = nodes["hub-a"]
    for name in engines:
        pair(entry, nodes[name])
    poll_until_offered(entry, [nodes[name] for name in engines], model)
    with entry.client(headers=entry.headers()) as c:
        r = c.patch("/api/inference/pool/settings", json={"poolPrefixAffinityMaxInFlight": max_in_flight})
        assert r.status_code == 200, r.text
    return nodes


def meshed(stack: Any, nodes: dict[str, RunningNode], models: list[str]) -> list[RunningNode]:
    """Start ``nodes`` in ``stack``, pair every two, and poll until each sees every other offer
    ``models``; the nodes in their order."""
    running = list(nodes.values())
    for n in running:
        stack.enter_context(n)
    for i, a in enumerate(running):
        for b in running[i + 1:]:
            pair(a, b)
    for n in running:
        for model in models:
            poll_until_offered(n, [m for m in running if m is not n], model)
    return running
