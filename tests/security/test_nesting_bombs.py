"""JSON nesting bombs (``[[[[…``) at every door, over HTTP.

``json.loads`` raises RecursionError, not ValueError, on deep nesting, and every parser here
used to catch only ValueError: an app or operator request became a 500, and a peer answering a
health probe with one killed the probe before it could count a strike, so a hostile peer stayed
``connected`` forever. Found by the ``frames`` and ``output_check`` fuzz corpora.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from harness import make_pool

from hubpool_core.peering.peers import new_token, seal_token, token_hash
from hubpool_core.store import PoolPeer

P = "/api/inference/pool"
BOMB = b"[" * 50_000  # far past the interpreter's recursion limit, well under every body cap
EVIL = "evil.example-tailnet.ts.net"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = make_pool(tmp_path_factory.mktemp("bombs"), ["hub-a"])["hub-a"].start()
    yield n
    n.stop()


@pytest.mark.parametrize("method,path,operator", [
    ("POST", "/v1/chat/completions", False),
    ("POST", "/api/chat", False),
    ("POST", "/api/generate", False),
    ("POST", "/api/show", False),
    ("POST", P + "/v1/embeddings", False),
    ("POST", P + "/pair/request", False),
    ("PATCH", P + "/settings", True),
    ("PATCH", "/api/inference/preferences", True),
    ("POST", P + "/pins", True),
    ("POST", P + "/peers/probe", True),
])
def test_a_nesting_bomb_is_a_400_not_a_500(node, method, path, operator):
    headers = {"Content-Type": "application/json", **(node.headers() if operator else {})}
    r = httpx.request(method, node.url + path, content=BOMB, headers=headers, timeout=30)
    assert r.status_code == 400, (path, r.status_code, r.text[:200])
    assert "error" in r.json() and "Traceback" not in r.text


class _Hostile(BaseHTTPRequestHandler):
    """A 'peer' that answers its capabilities probe (or the upgrade) with a nesting bomb."""

    upgrade_only = False

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802 - http.server's spelling
        if type(self).upgrade_only:
            caps = {"backends": [], "nodeUuid": "0b8e8f57-3f4a-4c1e-9a53-2f6f0c1d7e11"}  # triggers the upgrade
            self._send(json.dumps(caps).encode())
        else:
            self._send(BOMB)

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(BOMB)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("upgrade_only", [False, True])
def test_a_peer_answering_a_bomb_takes_strikes_and_the_tick_survives(node, upgrade_only):
    handler = type("H", (_Hostile,), {"upgrade_only": upgrade_only})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = new_token()
    row = node.node.peers.add(PoolPeer(node_fqdn=EVIL, direction="outbound", status="connected",
                                       verify_token_hash=token_hash(token),
                                       present_token_encrypted=seal_token(node.node.node_secret(), EVIL, token)))
    node.node.peer_urls[EVIL] = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for _ in range(3):
            node.run(node.node.health.poll_once())  # raised RecursionError before the fix
        after = node.node.peers.by_id(row.id)
        if upgrade_only:
            # capabilities were fine, so the peer stays connected; the upgrade simply did not complete
            assert after.status == "connected" and after.peer_public_key is None
        else:
            assert after.status == "unreachable" and after.consecutive_failures == 3
            assert node.node.health.failures[row.id].detail == "invalid capabilities payload"
    finally:
        node.node.peers.delete(row.id)
        node.node.peer_urls.pop(EVIL, None)
        server.shutdown()
        server.server_close()
