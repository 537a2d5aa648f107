"""Identity over time, through running nodes and their health tick: the bearer→signed
upgrade and its grace window, token retirement, rollback, renames, a peer whose identity
changed, and rotation."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from harness import fqdn, make_pool
from sqlalchemy import update

from hubpool_core.peering.peers import utcnow
from hubpool_core.store import identity_table

P = "/api/inference/pool"


def op(node, method, path, body=None, expect=200):
    with node.client(headers=node.headers()) as c:
        r = c.request(method, P + path, json=body)
    assert expect is None or r.status_code == expect, (r.status_code, r.text)
    return r.json()


def row(node, name):
    return node.node.peers.by_fqdn(fqdn(name))


@pytest.fixture
def pair(tmp_path):
    nodes = make_pool(tmp_path, ["hub-a", "hub-b", "hub-c"])
    for n in nodes.values():
        n.start()
    a, b = nodes["hub-a"], nodes["hub-b"]
    op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-b")})
    op(b, "POST", f"/peers/{fqdn('hub-a')}/approve")
    yield nodes
    for n in nodes.values():
        n.stop()


def make_legacy(node, other):
    """What a pairing made by a build before identities looks like: tokens only."""
    r = row(node, other)
    node.node.peers.update(r.id, peer_node_uuid=None, peer_public_key=None, signed_seen_at=None,
                           bearer_grace_until=None)


def test_a_bearer_pairing_upgrades_to_signed_and_retires_its_tokens(pair):
    a, b = pair["hub-a"], pair["hub-b"]
    make_legacy(a, "hub-b")
    make_legacy(b, "hub-a")
    assert op(a, "GET", "/status")["peers"][0]["authMode"] == "bearer"
    a.run(a.node.health.poll_once())  # probe (bearer) sees nodeUuid → /pair/upgrade
    assert row(a, "hub-b").peer_public_key and row(a, "hub-b").bearer_grace_until is None  # from a response
    assert row(b, "hub-a").peer_public_key and row(b, "hub-a").bearer_grace_until is not None  # from a request
    a.run(a.node.health.poll_once())  # A signs: B stamps signed_seen_at and ends its grace
    assert row(b, "hub-a").signed_seen_at is not None and row(b, "hub-a").bearer_grace_until is None
    b.run(b.node.health.poll_once())  # B signs to A; B retires its tokens
    assert row(b, "hub-a").verify_token_hash is None and row(b, "hub-a").present_token_encrypted is None
    a.run(a.node.health.poll_once())
    assert row(a, "hub-b").verify_token_hash is None and row(a, "hub-b").present_token_encrypted is None
    assert row(a, "hub-b").status == "connected" and row(b, "hub-a").status == "connected"
    # the operator route runs the exchange on demand; with nothing to upgrade it says so, and
    # calls nobody (the peer's row keeps its grace closed)
    again = op(a, "POST", f"/peers/{row(a, 'hub-b').id}/upgrade")
    assert again["upgraded"] is False and "nothing to upgrade" in again["message"]
    assert again["authMode"] == "signed" and row(b, "hub-a").bearer_grace_until is None


def test_the_operator_route_upgrades_a_bearer_pairing_at_once(pair):
    a, b = pair["hub-a"], pair["hub-b"]
    make_legacy(a, "hub-b")
    make_legacy(b, "hub-a")
    done = op(a, "POST", f"/peers/{row(a, 'hub-b').id}/upgrade")
    assert done["upgraded"] is True
    assert row(a, "hub-b").peer_public_key == b.node.identity.get().public_key  # each pinned the other's key
    assert row(b, "hub-a").peer_public_key == a.node.identity.get().public_key


def test_a_pin_that_never_sees_a_signature_is_rolled_back(pair):
    b = pair["hub-b"]
    r = row(b, "hub-a")
    b.node.peers.update(r.id, signed_seen_at=None, bearer_grace_until=utcnow() - timedelta(seconds=1))
    b.run(b.node.health.poll_once())
    after = row(b, "hub-a")
    assert after.peer_public_key is None and after.peer_node_uuid is None and after.bearer_grace_until is None
    assert after.status == "connected"  # rolled back, not locked out


def test_a_signed_peer_seen_under_a_new_name_is_renamed_by_the_tick(pair, tmp_path):
    a, b = pair["hub-a"], pair["hub-b"]
    b.run(b.node.health.poll_once())  # B now signs to A
    new_name = "hub-b-renamed.example-tailnet.ts.net"
    status_file = tmp_path / "hub-b-tailscale.json"
    status = json.loads(status_file.read_text())
    status["Self"]["DNSName"] = new_name + "."
    status_file.write_text(json.dumps(status))
    for d in b.node.directories:
        getattr(d, "invalidate", lambda: None)()
    a.node.peer_urls[new_name] = b.url
    b.run(b.node.health.poll_once())  # signed as the new name: recorded by A's guard, not applied
    assert row(a, "hub-b") is not None
    a.run(a.node.health.tick())  # the tick checks the name is on this tailnet, then applies it
    assert row(a, "hub-b") is None and a.node.peers.by_fqdn(new_name).status == "connected"


def test_a_peer_whose_identity_changed_is_named_and_leaves_routing_at_once(pair):
    a, b = pair["hub-a"], pair["hub-b"]
    b.run(b.node.health.poll_once())  # B signs to A, so A's grace ends and A signs too
    with b.node.db.engine.begin() as conn:  # B's database recreated: a new UUID under the same name
        changed = conn.execute(update(identity_table).where(identity_table.c.id == "self")
                               .values(node_uuid=str(uuid.uuid4())))
        assert changed.rowcount == 1
    b.node.identity._cached = None
    a.run(a.node.health.poll_once())
    peer = op(a, "GET", "/status")["peers"][0]
    assert peer["status"] == "unreachable"  # first strike, not third
    assert peer["probeFailure"]["kind"] == "identity_changed" and peer["probeFailure"]["httpStatus"] == 401
    assert "hubpool unpair" in peer["probeFailure"]["action"]
    assert peer["probeFailure"]["nextProbeAt"] is not None  # refusals back off


def test_an_unreachable_peer_takes_three_strikes_and_recovers_by_itself(pair):
    a, b = pair["hub-a"], pair["hub-b"]
    real = a.node.peer_urls[fqdn("hub-b")]
    a.node.peer_urls[fqdn("hub-b")] = "http://127.0.0.1:9"
    seen = []
    for _ in range(3):
        a.run(a.node.health.poll_once())
        seen.append(row(a, "hub-b").status)
    assert seen == ["connected", "connected", "unreachable"]
    assert op(a, "GET", "/status")["peers"][0]["probeFailure"]["kind"] == "unreachable"
    a.node.peer_urls[fqdn("hub-b")] = real
    a.run(a.node.health.poll_once())
    assert row(a, "hub-b").status == "connected" and row(a, "hub-b").consecutive_failures == 0


def test_rotation_keeps_the_uuid_unpairs_everyone_and_names_who_was_not_told(pair):
    a, b, c = pair["hub-a"], pair["hub-b"], pair["hub-c"]
    op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-c")})
    op(c, "POST", f"/peers/{fqdn('hub-a')}/approve")
    before = op(a, "GET", "/status")["localNode"]["identity"]
    c.stop()
    result = op(a, "POST", "/identity/rotate")
    assert result["nodeUuid"] == before["nodeUuid"]
    assert result["publicKeyFingerprint"] != before["publicKeyFingerprint"]
    assert sorted(result["unpaired"]) == [fqdn("hub-b"), fqdn("hub-c")]
    assert result["unreachable"] == [fqdn("hub-c")]
    assert op(a, "GET", "/peers") == [] and op(b, "GET", "/peers") == []  # B was told, signed with the old key


def _reload_identity(node):
    """What a restart does to the memoised identity: the next read loads it from the store."""
    node.node.identity._cached = None
    node.node.identity._retry_at = None


def test_rotation_with_an_identity_that_cannot_load_changes_nothing(pair):
    a, b = pair["hub-a"], pair["hub-b"]
    with a.node.db.engine.begin() as conn:  # the identity row cannot be read (a broken store)
        conn.exec_driver_sql("ALTER TABLE hub_pool_identity RENAME TO hub_pool_identity_moved")
    _reload_identity(a)
    with a.client(headers=a.headers()) as c:
        r = c.post(P + "/identity/rotate")
    assert r.status_code == 503, r.text
    assert row(a, "hub-b").status == "connected" and row(b, "hub-a").status == "connected"  # nobody was unpaired
    assert "cannot be loaded" in r.json()["error"] and "Nothing was changed" in r.json()["error"]
    with a.node.db.engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE hub_pool_identity_moved RENAME TO hub_pool_identity")


def test_rotation_with_a_corrupt_node_secret_changes_nothing(pair):
    a, b = pair["hub-a"], pair["hub-b"]
    before = op(a, "GET", "/status")["localNode"]["identity"]["publicKeyFingerprint"]
    secret = a.node.identity.secret_path
    kept = secret.read_bytes()
    secret.write_bytes(b"short")  # truncated: the key can neither be opened nor re-sealed
    with a.client(headers=a.headers()) as c:
        r = c.post(P + "/identity/rotate")
    assert r.status_code == 503, r.text
    assert "cannot be rotated" in r.json()["error"] and "5 bytes" in r.json()["error"]
    assert row(a, "hub-b").status == "connected" and row(b, "hub-a").status == "connected"
    secret.write_bytes(kept)
    assert op(a, "GET", "/status")["localNode"]["identity"]["publicKeyFingerprint"] == before  # key not replaced
