"""A bearer-only pairing under poolRequireSignedPeers (issue 26, item 20). Neither side admits
the other and the upgrade route answers 403 while the setting is on, so the pairing never comes
back by itself; on main the peer read "unreachable, rejoins by itself" and the CLI "down until
they upgrade". Now the failure has its own kind and action (turn the setting off, or re-pair with
a PIN), in /status, doctor, `hubpool status` and `hubpool peers`, and the way back it names works.
Two running nodes; the pairing made by an older build is their rows without pinned keys (as
tests/security/test_upgrade_state_machine.py builds it)."""

from __future__ import annotations

from harness import RunningNode, fqdn, make_pool
from typer.testing import CliRunner

from hubpool_core.cli.commands import app

P = "/api/inference/pool"


def hubpool(node: RunningNode, *args: str):
    env = {"HUB_POOL_DATA_DIR": str(node.env.data_dir), "HUB_POOL_LISTEN": f"127.0.0.1:{node.port}",
           "COLUMNS": "400"}
    return CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)


def peer(node: RunningNode, name: str) -> dict:
    with node.client(headers=node.headers()) as c:
        return next(p for p in c.get(P + "/status").json()["peers"] if p["nodeFqdn"] == fqdn(name))


def test_a_bearer_only_peer_under_require_signed_says_the_only_ways_back(tmp_path):
    nodes = make_pool(tmp_path, ["hub-a", "hub-b"], environ={"HUB_POOL_DEV_HEALTH_POLL_SECONDS": "300"})
    a, b = nodes["hub-a"].start(), nodes["hub-b"].start()
    try:
        with a.client(headers=a.headers()) as c:
            assert c.post(P + "/peers/pair", json={"nodeFqdn": fqdn("hub-b")}).status_code == 200
        with b.client(headers=b.headers()) as c:
            assert c.post(f"{P}/peers/{fqdn('hub-a')}/approve").status_code == 200
        for node, other in ((a, "hub-b"), (b, "hub-a")):  # a pairing an older build made: tokens, no keys
            row = node.node.peers.by_fqdn(fqdn(other))
            assert row.present_token_encrypted and row.verify_token_hash
            node.node.peers.update(row.id, peer_node_uuid=None, peer_public_key=None, signed_seen_at=None,
                                   bearer_grace_until=None)
        assert peer(a, "hub-b")["authMode"] == "bearer"
        r = hubpool(a, "settings", "poolRequireSignedPeers=true")
        assert r.exit_code == 0, r.output
        for _ in range(3):
            a.run(a.node.health.poll_once())

        p = peer(a, "hub-b")
        assert p["status"] == "unreachable", p
        failure = p["probeFailure"]
        assert failure["kind"] == "signed_required", failure
        action = failure["action"]
        assert "it does not come back by itself" in action
        assert "hubpool settings poolRequireSignedPeers=false" in action
        assert f"hubpool unpair {fqdn('hub-b')}" in action and "--pin" in action

        status = hubpool(a, "status").stdout
        assert "rejoins by itself" not in status and "until they upgrade" not in status
        assert ("poolRequireSignedPeers is on, so that pairing is down and cannot upgrade while it is: the only ways "
                "back are turning the setting off") in status, status
        assert "Peers held off by poolRequireSignedPeers (they do not rejoin by themselves)" in status
        assert action in status
        assert "unsigned: refused" in hubpool(a, "peers").stdout
        with a.client(headers=a.headers()) as c:
            f1 = [x for x in c.get(P + "/doctor").json()["checks"] if x["id"] == "F1"]
        assert f1[0]["verdict"] == "needs action" and "does not come back by itself" in f1[0]["detail"], f1
        assert f1[0]["fix"] == action
        with a.client() as c:
            metrics = c.get("/metrics").text
        assert f'hubpool_peer_probe_failure{{kind="signed_required",peer="{fqdn("hub-b")}"}} 1.0' in metrics, \
            [line for line in metrics.splitlines() if "probe_failure" in line]

        # the way back the action names: the setting off, one health check, and it is signed
        assert hubpool(a, "settings", "poolRequireSignedPeers=false").exit_code == 0
        a.run(a.node.health.poll_once())
        a.run(a.node.health.poll_once())
        p = peer(a, "hub-b")
        assert p["status"] == "connected" and p["probeFailure"] is None, p
        assert p["authMode"] == "signed"
        assert hubpool(a, "settings", "poolRequireSignedPeers=true").exit_code == 0  # and back on: it stays
        a.run(a.node.health.poll_once())
        p = peer(a, "hub-b")
        assert p["status"] == "connected" and p["probeFailure"] is None, p
    finally:
        a.stop()
        b.stop()
