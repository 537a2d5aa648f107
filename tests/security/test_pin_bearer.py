"""The bearer a PIN request carried is no credential (issue 26 item 3).

Pairing by address sends the PIN request in plain HTTP across the LAN, and the request carries
the bearer token the other Hub is to present back. Before issue 26 the requester's row, whose
key was already pinned from the PIN answer, still admitted that bearer until the peer was first
seen signing: whoever read the request could confirm the pairing for the other Hub
(``/pair/confirm``) and run work on the requester's engines (``/local/*``).

Here the LAN is a TCP relay between hub-a and hub-b that keeps what hub-a sent. An eavesdropper
takes the token from it and presents it to hub-a as hub-b; hub-a refuses every use of it. hub-b's
own confirm (signed) still completes the pairing, and both sides then poll each other signed.
"""

from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest
from harness import fqdn, make_pool

P = "/api/inference/pool"


class Wire:
    """A TCP relay on loopback that forwards to ``port`` and keeps the bytes sent through it."""

    def __init__(self, port: int):
        self.target = port
        self.seen = bytearray()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.closing = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pump, args=(conn, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, conn, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, keep: bool) -> None:
        try:
            while chunk := src.recv(65536):
                if keep:
                    self.seen.extend(chunk)
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.closing.set()
        self.sock.close()


def op(node, method, path, body=None, expect=200):
    with node.client(headers=node.headers()) as c:
        r = c.request(method, P + path, json=body)
    assert r.status_code == expect, (path, r.status_code, r.text)
    return r.json()


@pytest.fixture
def pool(tmp_path):
    nodes = make_pool(tmp_path, ["hub-a", "hub-b"], {"HUB_POOL_DEV_ALLOW_LOOPBACK_PEERS": "true"})
    a, b = nodes["hub-a"].start(), nodes["hub-b"].start()
    wire = Wire(b.port)
    yield a, b, wire
    wire.close()
    a.stop()
    b.stop()


def test_the_token_a_pin_request_carried_opens_nothing_on_the_requester(pool):
    a, b, wire = pool
    pin = op(b, "POST", "/pairing-pin")["pin"]
    row = op(a, "POST", "/peers/pair", {"address": f"127.0.0.1:{wire.port}", "pin": pin})
    assert row["nodeFqdn"] == fqdn("hub-b") and row["status"] == "pending" and row["authMode"] == "signed"
    # what an eavesdropper on the LAN read: the PIN request, and the token in it
    sent = bytes(wire.seen)
    assert b"POST " + P.encode() + b"/pair/request " in sent
    token = json.loads(sent.split(b"\r\n\r\n", 1)[1])["token"]
    assert len(token) >= 32
    stolen = {"X-Hub-Pool-Peer": fqdn("hub-b"), "Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=a.url, timeout=30, trust_env=False, headers=stolen) as thief:
        confirm = thief.post(P + "/pair/confirm", json={"fromNodeFqdn": fqdn("hub-b"), "token": "t" * 64})
        tags = thief.get(P + "/local/api/tags")
        chat = thief.post(P + "/local/api/chat", json={"model": "m", "messages": []},
                          headers={"X-Hub-Pool-Backend": "ollama"})
        upgrade = thief.post(P + "/pair/upgrade", json={"nodeUuid": "0b8e8f57-3f4a-4c1e-9a53-2f6f0c1d7e11",
                                                        "publicKey": "x" * 44})
    for name, r in (("confirm", confirm), ("tags", tags), ("chat", chat), ("upgrade", upgrade)):
        assert r.status_code == 401, (name, r.status_code, r.text)
    assert op(a, "GET", "/peers")[0]["status"] == "pending"  # nobody confirmed it for hub-b

    # hub-b's own confirm is signed, and completes the pairing; both sides then poll signed
    approved = op(b, "POST", f"/peers/{fqdn('hub-a')}/approve")
    assert approved["callbackDelivered"] is True, approved
    assert op(a, "GET", "/peers")[0]["status"] == "connected"
    for node in (b, a, b):
        node.run(node.node.health.poll_once())
        assert node.node.health.failures == {}, node.node.health.failures
    for node in (a, b):
        peer = op(node, "GET", "/peers")[0]
        assert peer["status"] == "connected" and peer["authMode"] == "signed", peer
    # and the stolen token is still nothing
    r = httpx.get(a.url + P + "/local/api/tags", headers=stolen, timeout=30)
    assert r.status_code == 401


def test_a_pin_pairing_by_name_keeps_no_bearer_either(pool):
    """The same rule for a PIN pairing by name: a key from a PIN answer takes signatures only
    (here hub-a reaches hub-b's name through the relay, as if its HTTPS were read)."""
    a, b, wire = pool
    a.node.peer_urls[fqdn("hub-b")] = f"http://127.0.0.1:{wire.port}"
    pin = op(b, "POST", "/pairing-pin")["pin"]
    op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-b"), "pin": pin})
    token = json.loads(bytes(wire.seen).split(b"\r\n\r\n", 1)[1])["token"]
    stolen = {"X-Hub-Pool-Peer": fqdn("hub-b"), "Authorization": f"Bearer {token}"}
    r = httpx.post(a.url + P + "/pair/confirm", json={"token": "t" * 64}, headers=stolen, timeout=30)
    assert r.status_code == 401, r.text
    op(b, "POST", f"/peers/{fqdn('hub-a')}/approve")
    assert op(a, "GET", "/peers")[0]["status"] == "connected"
