"""Pairing between real nodes on loopback, as an operator does it: with a PIN, without one,
by address, approve, reject, unpair — over HTTP and through the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from harness import fqdn, make_pool

P = "/api/inference/pool"


def op(node, method: str, path: str, body=None, expect: int | None = 200):
    with node.client(headers=node.headers()) as c:
        r = c.request(method, P + path, json=body)
    if expect is not None:
        assert r.status_code == expect, (r.status_code, r.text)
    return r.json()


def rows(node) -> dict[str, dict]:
    return {r["nodeFqdn"]: r for r in op(node, "GET", "/peers")}


def fingerprint(node) -> str:
    return op(node, "GET", "/status")["localNode"]["identity"]["publicKeyFingerprint"]


@pytest.fixture
def pool2(tmp_path):
    nodes = make_pool(tmp_path, ["hub-a", "hub-b"])
    for n in nodes.values():
        n.start()
    yield nodes
    for n in nodes.values():
        n.stop()


@pytest.fixture
def pool3(tmp_path):
    nodes = make_pool(tmp_path, ["hub-a", "hub-b", "hub-c"])
    for n in nodes.values():
        n.start()
    yield nodes
    for n in nodes.values():
        n.stop()


def test_status_knows_this_nodes_tailnet_name_and_identity(pool2):
    status = op(pool2["hub-a"], "GET", "/status")
    assert status["localNode"]["nodeFqdn"] == fqdn("hub-a")
    assert status["localNode"]["tailscaleConnected"] is True
    assert status["localNode"]["tailnet"] == "example-tailnet.ts.net"
    assert status["localNode"]["identity"]["publicKeyFingerprint"].count(":") == 7
    assert status["reason"] == "no_peers"


def test_pair_with_a_pin_then_approve(pool2):
    a, b = pool2["hub-a"], pool2["hub-b"]
    minted = op(b, "POST", "/pairing-pin")
    assert len(minted["pin"]) == 6 and minted["pin"].isdigit()
    assert op(b, "GET", "/status")["pairingPin"]["active"] is True
    assert "pin" not in op(b, "GET", "/status")["pairingPin"]
    row = op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-b"), "pin": minted["pin"]})
    assert row["status"] == "pending" and row["direction"] == "outbound"
    assert row["peerKeyFingerprint"] == fingerprint(b)  # learned with the PIN, from B's answer
    inbound = rows(b)[fqdn("hub-a")]
    assert inbound["status"] == "pending" and inbound["direction"] == "inbound"
    assert inbound["peerKeyFingerprint"] == fingerprint(a)  # what the approver compares
    assert op(b, "GET", "/status")["pairingPin"]["active"] is False  # single use
    approved = op(b, "POST", f"/peers/{inbound['id'][:8]}/approve")
    assert approved["status"] == "connected"
    a_row = rows(a)[fqdn("hub-b")]
    assert a_row["status"] == "connected" and a_row["authMode"] == "signed"
    assert a_row["signedSeenAt"] is not None  # the confirm arrived signed
    assert rows(b)[fqdn("hub-a")]["authMode"] == "signed"
    for n in (a, b):
        assert op(n, "GET", "/status")["peerCounts"]["connected"] == 1


def test_pair_without_a_pin_then_approve_by_name(pool2):
    a, b = pool2["hub-a"], pool2["hub-b"]
    row = op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-b")})
    assert row["status"] == "pending" and row["peerKeyFingerprint"] is None
    inbound = rows(b)[fqdn("hub-a")]
    assert inbound["peerKeyFingerprint"] is None  # no PIN, no key: the name is only a claim
    op(b, "POST", f"/peers/{fqdn('hub-a')}/approve")
    assert rows(a)[fqdn("hub-b")]["status"] == "connected"
    assert rows(b)[fqdn("hub-a")]["status"] == "connected"
    # the identity exchange rode the authenticated confirm: both ends are pinned
    assert rows(a)[fqdn("hub-b")]["peerKeyFingerprint"] == fingerprint(b)
    assert rows(b)[fqdn("hub-a")]["peerKeyFingerprint"] == fingerprint(a)


def test_reject_clears_both_sides(pool2):
    a, b = pool2["hub-a"], pool2["hub-b"]
    op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-b")})
    inbound = rows(b)[fqdn("hub-a")]
    assert op(b, "POST", f"/peers/{inbound['id']}/reject") == {"success": True}
    assert rows(b) == {}
    assert rows(a) == {}  # the authenticated callback dropped the requester's half


def test_unpair_tells_the_other_side(pool2):
    a, b = pool2["hub-a"], pool2["hub-b"]
    op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-b")})
    op(b, "POST", f"/peers/{fqdn('hub-a')}/approve")
    assert op(a, "DELETE", f"/peers/{rows(a)[fqdn('hub-b')]['id'][:8]}") == {"success": True, "told": True,
                                                                             "message": None}
    assert rows(a) == {} and rows(b) == {}
    # and they can pair again
    op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-b")})
    assert rows(b)[fqdn("hub-a")]["status"] == "pending"


def test_a_second_request_while_a_row_exists(pool2):
    a, b = pool2["hub-a"], pool2["hub-b"]
    op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-b")})
    r = op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-b")}, expect=409)
    assert r["error"] == f"Already paired or pairing with {fqdn('hub-b')}"
    # B also asked A: each holds a row for its own request, so each ignores the other's
    op(b, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-a")}, expect=409)


def test_a_node_refuses_to_pair_with_itself(pool2):
    a = pool2["hub-a"]
    assert op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-a")}, expect=409)["error"].endswith("is this Hub")


def test_pair_by_address_needs_the_dev_switch_on_loopback(pool2):
    a, b = pool2["hub-a"], pool2["hub-b"]
    pin = op(b, "POST", "/pairing-pin")["pin"]
    r = op(a, "POST", "/peers/pair", {"address": f"127.0.0.1:{b.port}", "pin": pin}, expect=400)
    assert "loopback" in r["error"].lower()
    assert op(b, "GET", "/status")["pairingPin"]["active"] is True  # refused before any call


def test_pair_by_address_with_a_pin(tmp_path):
    nodes = make_pool(tmp_path, ["hub-a", "hub-b"], {"HUB_POOL_DEV_ALLOW_LOOPBACK_PEERS": "true"})
    a, b = nodes["hub-a"].start(), nodes["hub-b"].start()
    try:
        probe = op(a, "POST", "/peers/probe", {"address": f"127.0.0.1:{b.port}"})
        assert probe == {"address": f"127.0.0.1:{b.port}", "isCiHub": True, "poolProtocol": 2,
                         "pairable": True, "reason": None}
        op(a, "POST", "/peers/pair", {"address": f"127.0.0.1:{b.port}"}, expect=400)  # no PIN, no name
        pin = op(b, "POST", "/pairing-pin")["pin"]
        row = op(a, "POST", "/peers/pair", {"address": f"127.0.0.1:{b.port}", "pin": pin})
        assert row["nodeFqdn"] == fqdn("hub-b")  # the PIN exchange is what named it
        assert row["peerKeyFingerprint"] == fingerprint(b)
        op(b, "POST", f"/peers/{fqdn('hub-a')}/approve")
        assert rows(a)[fqdn("hub-b")]["status"] == "connected"
    finally:
        a.stop()
        b.stop()


def test_three_nodes_pair_in_a_star(pool3):
    a, b, c = pool3["hub-a"], pool3["hub-b"], pool3["hub-c"]
    op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-b")})
    pin = op(c, "POST", "/pairing-pin")["pin"]
    op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-c"), "pin": pin})
    op(b, "POST", f"/peers/{fqdn('hub-a')}/approve")
    op(c, "POST", f"/peers/{fqdn('hub-a')}/approve")
    assert {k: v["status"] for k, v in rows(a).items()} == {fqdn("hub-b"): "connected", fqdn("hub-c"): "connected"}
    # B and C pair with each other too
    op(b, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-c")})
    op(c, "POST", f"/peers/{fqdn('hub-b')}/reject")
    assert fqdn("hub-c") not in rows(b)
    assert op(a, "GET", "/status")["peerCounts"] == {"total": 2, "connected": 2, "pending": 0, "unreachable": 0,
                                                      "disabled": 0}


def _cli(node, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HUB_POOL_DATA_DIR": str(node.env.data_dir), "HUB_POOL_LISTEN": f"127.0.0.1:{node.port}",
           "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "hubpool_core.cli", *args], capture_output=True, text=True,
                          env=env, timeout=60, stdin=subprocess.DEVNULL)


def test_the_cli_flow_an_operator_follows(pool2):
    a, b = pool2["hub-a"], pool2["hub-b"]
    minted = _cli(b, "pairing-pin")
    assert minted.returncode == 0, minted.stderr
    pin = minted.stdout.split("Pairing PIN:")[1].split()[0]
    refused = _cli(a, "pair", fqdn("hub-b"), "--pin", pin)
    assert refused.returncode == 1 and "--yes" in refused.stderr  # cannot prompt here
    sent = _cli(a, "pair", fqdn("hub-b"), "--pin", pin, "--yes")
    assert sent.returncode == 0, sent.stderr
    listed = _cli(b, "peers")
    assert "pending" in listed.stdout and fqdn("hub-a") in listed.stdout
    prefix = rows(b)[fqdn("hub-a")]["id"][:8]
    assert prefix in listed.stdout
    approved = subprocess.run(
        [sys.executable, "-m", "hubpool_core.cli", "approve", prefix], capture_output=True, text=True, timeout=60,
        env={**os.environ, "HUB_POOL_DATA_DIR": str(b.env.data_dir), "HUB_POOL_LISTEN": f"127.0.0.1:{b.port}",
             "HUB_POOL_ASSUME_YES": "1"}, stdin=subprocess.DEVNULL)
    assert approved.returncode == 0, approved.stderr
    assert "connected" in _cli(a, "peers").stdout
    assert _cli(a, "unpair", fqdn("hub-b"), "--yes").returncode == 0
    deadline = time.monotonic() + 5
    while rows(b) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rows(b) == {}
    bad = _cli(a, "approve", "nope", "--yes")
    assert bad.returncode == 1 and "No pool peer" in bad.stderr and "Traceback" not in bad.stderr


def _raw_request(node, name, pin=None):
    import httpx

    body = {"fromNodeFqdn": name, "token": "b" * 64}
    if pin:
        body["pin"] = pin
    return httpx.post(node.url + P + "/pair/request", json=body)


def test_the_receiver_discloses_its_name_only_for_a_valid_pin(pool2):
    b = pool2["hub-b"]
    plain = _raw_request(b, "stranger.example-tailnet.ts.net")
    assert plain.status_code == 200 and plain.json() == {"received": True}
    pin = op(b, "POST", "/pairing-pin")["pin"]
    named = _raw_request(b, "friend.example-tailnet.ts.net", pin).json()
    assert named["nodeFqdn"] == fqdn("hub-b") and named["nodeUuid"] and named["publicKey"]


def test_the_receiver_refuses_its_own_name_and_ignores_a_known_one(pool2):
    b = pool2["hub-b"]
    r = _raw_request(b, fqdn("hub-b"))
    assert r.status_code == 400 and r.json()["error"] == "That address is this Hub — a Hub cannot pair with itself"
    assert _raw_request(b, "dup.example-tailnet.ts.net").json() == {"received": True}
    assert _raw_request(b, "dup.example-tailnet.ts.net").json() == {}  # silently ignored
    assert [r["nodeFqdn"] for r in op(b, "GET", "/peers")] == ["dup.example-tailnet.ts.net"]


def test_half_paired_when_the_callback_fails(pool2, caplog):
    a, b = pool2["hub-a"], pool2["hub-b"]
    op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-b")})
    a.stop()  # the requester goes away before the approval
    with caplog.at_level("WARNING", logger="hubpool.pairing"):
        approved = op(b, "POST", f"/peers/{fqdn('hub-a')}/approve")
    assert approved["status"] == "connected"  # the approval stands
    assert f"pairing confirmed locally but callback to {fqdn('hub-a')} failed" in caplog.text


def test_pending_requests_expire_after_24_hours_on_both_sides(pool2):
    from datetime import timedelta

    from hubpool_core.peering.peers import utcnow

    a, b = pool2["hub-a"], pool2["hub-b"]
    op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-b")})
    for node, other in ((a, "hub-b"), (b, "hub-a")):
        row = node.node.peers.by_fqdn(fqdn(other))
        node.node.peers.update(row.id, created_at=utcnow() - timedelta(hours=23))
        node.node.housekeeping()
        assert rows(node), "a 23-hour-old request is kept"
        node.node.peers.update(row.id, created_at=utcnow() - timedelta(hours=24, seconds=1))
        node.node.housekeeping()
        assert rows(node) == {}


def test_after_a_pin_pairing_either_side_may_poll_first(pool2):
    """The approver polls the requester before the requester has sent it anything signed."""
    a, b = pool2["hub-a"], pool2["hub-b"]
    pin = op(b, "POST", "/pairing-pin")["pin"]
    op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-b"), "pin": pin})
    op(b, "POST", f"/peers/{fqdn('hub-a')}/approve")
    b.run(b.node.health.poll_once())
    assert b.node.health.failures == {}
    assert b.node.peers.by_fqdn(fqdn("hub-a")).last_capabilities is not None
    a.run(a.node.health.poll_once())
    assert a.node.health.failures == {}


def test_a_pin_that_is_not_six_ascii_digits_is_a_400_that_spends_nothing(pool2):
    import httpx

    a, b = pool2["hub-a"], pool2["hub-b"]
    pin = op(b, "POST", "/pairing-pin")["pin"]
    # the operator route refuses it before anything is sent
    sent = op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-b"), "pin": "١٢٣٤٥٦"}, expect=400)
    assert sent["error"] == "pin must be exactly six ASCII digits (0-9)"
    assert rows(a) == {} and rows(b) == {}
    # the receiver: Arabic-Indic and full-width digits pass str.isdigit() but are not a PIN; more
    # of them than the cooldown's two strikes and the PIN's five tries, all from hub-a's name
    for bad in ("١٢٣٤٥٦", "１２３４５６", "١٢٣٤٥٦", "12345", "1234567", "12345a", 123456, "١٢٣٤٥٦"):
        body = {"fromNodeFqdn": fqdn("hub-a"), "token": "b" * 64, "pin": bad}
        r = httpx.post(b.url + P + "/pair/request", json=body)
        assert r.status_code == 400, (bad, r.status_code, r.text)
        assert r.json() == {"error": "pin must be exactly six ASCII digits (0-9)"}
    assert rows(b) == {}
    # no strike and no try was spent: the real PIN still pairs, from the same name and address
    op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-b"), "pin": pin})
    assert rows(b)[fqdn("hub-a")]["status"] == "pending" and rows(b)[fqdn("hub-a")]["peerKeyFingerprint"]


def test_the_sender_reads_a_403_to_a_pin_request_as_a_refused_pin(tmp_path):
    import json

    nodes = make_pool(tmp_path, ["hub-a", "hub-b"])
    status_file = tmp_path / "hub-b-tailscale.json"  # hub-b answers from another tailnet: a 403
    status = json.loads(status_file.read_text())
    status["MagicDNSSuffix"] = status["CurrentTailnet"]["MagicDNSSuffix"] = "other-tailnet.ts.net"
    status_file.write_text(json.dumps(status))
    a, b = nodes["hub-a"], nodes["hub-b"]
    with a, b:
        pin = op(b, "POST", "/pairing-pin")["pin"]
        r = _cli(a, "pair", fqdn("hub-b"), "--pin", pin, "--yes")
        assert r.returncode == 1
        said = " ".join(r.stderr.split())  # rich wraps the line
        assert "Peer refused the pairing PIN (403). Mint a fresh one on that Hub" in said, r.stderr
        assert "only accepted from devices on this tailnet" in said  # the reason it gave is kept
        assert rows(a) == {} and rows(b) == {}


def test_the_cli_says_what_approve_and_unpair_really_did(pool2):
    a, b = pool2["hub-a"], pool2["hub-b"]
    op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-b")})  # no PIN
    own = _cli(a, "approve", fqdn("hub-b"), "--yes")  # approving the request this Hub sent
    said = " ".join(own.stderr.split())
    assert own.returncode == 1 and f"so it is approved there: on {fqdn('hub-b')}, run `hubpool approve " \
        f"{fqdn('hub-a')}`" in said, own.stderr
    # cancelling a request sent without a PIN cannot withdraw it there, and says so
    cancelled = _cli(a, "unpair", fqdn("hub-b"), "--yes")
    said = " ".join(cancelled.stdout.split())
    assert cancelled.returncode == 0 and f"{fqdn('hub-b')} was not told" in said and "stays pending there" in said
    assert f"`hubpool reject {fqdn('hub-a')}`" in said  # the command to run there, with this Hub's name
    assert rows(a) == {} and rows(b)[fqdn("hub-a")]["status"] == "pending"  # what it said is what happened
    # hub-b approves that orphan: its callback is refused (hub-a holds no row), so it is not "connected"
    approved = _cli(b, "approve", fqdn("hub-a"), "--yes")
    said = " ".join((approved.stdout + approved.stderr).split())
    assert approved.returncode == 1, said
    assert "connected" not in said and f"{fqdn('hub-a')} could not be told" in said and "half paired" in said
    op(b, "DELETE", f"/peers/{fqdn('hub-a')}")
    # with a PIN the request can be withdrawn: hub-b is told and drops it
    pin = op(b, "POST", "/pairing-pin")["pin"]
    op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-b"), "pin": pin})
    assert rows(b)[fqdn("hub-a")]["status"] == "pending"
    withdrawn = _cli(a, "unpair", fqdn("hub-b"), "--yes")
    assert withdrawn.returncode == 0 and "the other Hub was told" in withdrawn.stdout, withdrawn.stdout
    assert rows(b) == {}
