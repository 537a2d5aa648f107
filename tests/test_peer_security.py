"""Attacks on the peer protocol, each against running nodes: replay, a signature moved to
another recipient, clock skew, bearer downgrade, PIN guessing, request flooding, names
that smuggle a scheme or port, and SSRF through probe."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from harness import fqdn, make_pool

from hubpool_core.peering.peers import open_token
from hubpool_core.peering.signing import sign_headers

P = "/api/inference/pool"
CAPS = P + "/capabilities"


def op(node, method, path, body=None, expect=200):
    with node.client(headers=node.headers()) as c:
        r = c.request(method, P + path, json=body)
    assert expect is None or r.status_code == expect, (r.status_code, r.text)
    return r.json()


def peer_row(node, name):
    return next(r for r in op(node, "GET", "/peers") if r["nodeFqdn"] == fqdn(name))


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """hub-a paired with hub-b and hub-c, both with a PIN, so every pair is signed."""
    root = tmp_path_factory.mktemp("pool")
    nodes = make_pool(root, ["hub-a", "hub-b", "hub-c"])
    for n in nodes.values():
        n.start()
    a = nodes["hub-a"]
    for other in ("hub-b", "hub-c"):
        pin = op(nodes[other], "POST", "/pairing-pin")["pin"]
        op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn(other), "pin": pin})
        op(nodes[other], "POST", f"/peers/{fqdn('hub-a')}/approve")
    yield nodes
    for n in nodes.values():
        n.stop()


def signed(sender, recipient, method="GET", path=CAPS, body=None, now_ms=None):
    kp = sender.node.identity.get()
    recipient_uuid = recipient.node.identity.get().node_uuid
    return sign_headers(kp, method, path, kp.node_uuid, sender.env_fqdn, recipient_uuid, body, now_ms=now_ms)


@pytest.fixture(autouse=True)
def _names(pool):
    for name, n in pool.items():
        n.env_fqdn = fqdn(name)


def test_a_signed_request_is_accepted_once_and_a_replay_is_refused(pool):
    a, b = pool["hub-a"], pool["hub-b"]
    headers = signed(a, b)
    first = httpx.get(b.url + CAPS, headers=headers)
    assert first.status_code == 200 and first.json()["nodeUuid"] == b.node.identity.get().node_uuid
    replay = httpx.get(b.url + CAPS, headers=headers)
    assert replay.status_code == 401 and replay.json() == {"error": "Invalid pool peer credentials"}


def test_a_signature_made_for_b_is_refused_by_c(pool):
    a, b, c = pool["hub-a"], pool["hub-b"], pool["hub-c"]
    headers = signed(a, b)
    r = httpx.get(c.url + CAPS, headers=headers)
    assert r.status_code == 401 and r.headers["x-hub-pool-refusal"] == "identity-mismatch"
    # without the clear-text recipient the signature itself still fails at C
    bare = {k: v for k, v in signed(a, b).items() if k != "X-Hub-Pool-Recipient"}
    r = httpx.get(c.url + CAPS, headers=bare)
    assert r.status_code == 401 and "x-hub-pool-refusal" not in r.headers


@pytest.mark.parametrize("skew_ms,status", [(-301_000, 401), (301_000, 401), (-290_000, 200), (290_000, 200)])
def test_clock_skew_window(pool, skew_ms, status):
    a, b = pool["hub-a"], pool["hub-b"]
    headers = signed(a, b, now_ms=int(time.time() * 1000) + skew_ms)
    assert httpx.get(b.url + CAPS, headers=headers).status_code == status


def test_a_tampered_signed_control_body_is_refused(pool):
    a, b = pool["hub-a"], pool["hub-b"]
    body = {"nodeUuid": a.node.identity.get().node_uuid, "publicKey": a.node.identity.get().public_key}
    headers = signed(a, b, "POST", P + "/pair/upgrade", body)
    r = httpx.post(b.url + P + "/pair/upgrade", headers=headers, json={**body, "nodeUuid": "0" * 8 + "-0000-4000-8000-" + "0" * 12})
    assert r.status_code == 401


def test_a_bearer_token_from_a_row_that_has_signed_is_refused(pool):
    a, b = pool["hub-a"], pool["hub-b"]
    assert httpx.get(b.url + CAPS, headers=signed(a, b)).status_code == 200  # B has now seen A sign
    assert peer_row(b, "hub-a")["signedSeenAt"] is not None
    row = a.node.peers.by_fqdn(fqdn("hub-b"))
    token = open_token(a.node.node_secret(), row.node_fqdn, row.present_token_encrypted)
    r = httpx.get(b.url + CAPS, headers={"X-Hub-Pool-Peer": fqdn("hub-a"), "Authorization": f"Bearer {token}"})
    assert r.status_code == 401 and r.json()["error"] == "Invalid pool peer credentials"


def test_unpaired_callers_get_401(pool):
    b = pool["hub-b"]
    assert httpx.get(b.url + CAPS).status_code == 401
    r = httpx.get(b.url + CAPS, headers={"X-Hub-Pool-Peer": fqdn("hub-a"), "Authorization": "Bearer " + "f" * 64})
    assert r.status_code == 401
    r = httpx.get(b.url + CAPS, headers={"X-Hub-Pool-Peer": "stranger.example-tailnet.ts.net",
                                         "Authorization": "Bearer " + "f" * 64})
    assert r.status_code == 401 and r.json()["error"] == "Unknown pool peer"
    for route in ("/pair/confirm", "/pair/reject", "/pair/unpair", "/pair/upgrade"):
        assert httpx.post(b.url + P + route, json={}).status_code == 401


def _request(node, name, pin=None, headers=None):
    body = {"fromNodeFqdn": name, "token": "a" * 64}
    if pin is not None:
        body["pin"] = pin
    return httpx.post(node.url + P + "/pair/request", json=body, headers=headers or {})


def test_five_wrong_pins_destroy_the_pin(tmp_path):
    b = make_pool(tmp_path, ["hub-b"])["hub-b"].start()
    try:
        pin = op(b, "POST", "/pairing-pin")["pin"]
        wrong = f"{(int(pin) + 1) % 1_000_000:06d}"
        proxied = {"X-Forwarded-For": "10.9.9.9"}  # an untrusted hop: the cooldown keys on the name alone
        answers = [_request(b, f"guess{i}.example-tailnet.ts.net", wrong, proxied) for i in range(5)]
        assert [r.status_code for r in answers] == [401] * 5
        assert {r.text for r in answers} == {'{"error":"Invalid or expired pairing PIN"}'}
        right = _request(b, "late.example-tailnet.ts.net", pin, proxied)
        assert right.status_code == 401  # destroyed by the fifth wrong guess
        assert op(b, "GET", "/peers") == []  # no guess created anything
    finally:
        b.stop()


def test_a_source_that_keeps_guessing_gets_429(tmp_path):
    b = make_pool(tmp_path, ["hub-b"])["hub-b"].start()
    try:
        pin = op(b, "POST", "/pairing-pin")["pin"]
        wrong = f"{(int(pin) + 7) % 1_000_000:06d}"
        codes = [_request(b, "guess.example-tailnet.ts.net", wrong).status_code for _ in range(3)]
        assert codes == [401, 401, 429]
        r = _request(b, "other.example-tailnet.ts.net", pin)  # same IP: still cooling down
        assert r.status_code == 429
    finally:
        b.stop()


def test_the_21st_pending_request_is_refused(tmp_path):
    b = make_pool(tmp_path, ["hub-b"])["hub-b"].start()
    try:
        for i in range(20):
            assert _request(b, f"n{i}.example-tailnet.ts.net").status_code == 200
        r = _request(b, "n20.example-tailnet.ts.net")
        assert r.status_code == 503
        assert r.json()["error"] == "Too many pairing requests are already awaiting approval on this node"
        assert len(op(b, "GET", "/peers")) == 20
    finally:
        b.stop()


@pytest.mark.parametrize("name", [
    "100.64.0.2", "https://hub-x.example-tailnet.ts.net", "hub-x.example-tailnet.ts.net:5002",
    "user@hub-x.example-tailnet.ts.net", "hub-x.example-tailnet.ts.net/api", "[fd7a::1]", "hub-x", "",
])
def test_from_node_fqdn_must_be_a_bare_hostname(pool, name):
    r = _request(pool["hub-b"], name)
    assert r.status_code == 400
    assert r.json()["error"] == ("Peer node FQDN must be a bare hostname (no scheme, credentials, port, path or "
                                 "IP literal)")


def test_a_name_outside_this_tailnet_is_refused(pool):
    r = _request(pool["hub-b"], "hub-x.other-tailnet.ts.net")
    assert r.status_code == 403 and r.json()["error"] == "Pairing requests are only accepted from devices on this tailnet"


HOSTS = Path("/etc/hosts")
PUBLIC_NAME = "hubpool-public-test.invalid"


@pytest.fixture
def public_hostname():
    """A name that resolves to a public (documentation) address, via the hosts file."""
    original = HOSTS.read_text()
    try:
        HOSTS.write_text(original + f"\n203.0.113.7 {PUBLIC_NAME}\n")
    except OSError:
        pytest.fail("this test needs a writable /etc/hosts (CI runs as root)")
    yield PUBLIC_NAME
    HOSTS.write_text(original)


@pytest.mark.parametrize("address", ["127.0.0.1", "169.254.169.254", "8.8.8.8", "203.0.113.7:5002", "[::1]:5002",
                                     "localhost"])
def test_probe_refuses_loopback_link_local_and_public(pool, address):
    r = op(pool["hub-a"], "POST", "/peers/probe", {"address": address}, expect=400)
    assert r["error"]


def test_probe_refuses_a_hostname_that_resolves_to_a_public_address(pool, public_hostname):
    r = op(pool["hub-a"], "POST", "/peers/probe", {"address": public_hostname}, expect=400)
    assert "203.0.113.7" in r["error"] or "public" in r["error"]


def test_discovery_makes_no_network_call_without_a_directory(tmp_path):
    from harness import RunningNode

    calls = []
    with RunningNode(tmp_path / "n") as node:  # no tailnet, no Admin API credential, no Portal
        node.node.peer_client._http = httpx.AsyncClient(
            transport=httpx.MockTransport(lambda req: calls.append(req) or httpx.Response(500)))
        assert op(node, "GET", "/peers/discoverable") == []
    assert calls == []
