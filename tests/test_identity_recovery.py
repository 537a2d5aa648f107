"""What the operator is told when pairing breaks, through running nodes and the real CLI: a node
whose own key cannot be opened (its node.secret lost) and a peer that refuses this node.

spec "Failure modes" (the only recovery for an undecryptable key is rotation) and "A peer whose
identity changed" (doctor F1 names the commands to run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from harness import fqdn, make_pool, pair

P = "/api/inference/pool"


def cli(node, *args):
    env = {**os.environ, "HUB_POOL_DATA_DIR": str(node.env.data_dir), "HUB_POOL_LISTEN": f"127.0.0.1:{node.port}",
           "COLUMNS": "250"}
    return subprocess.run([sys.executable, "-m", "hubpool_core.cli", *args], capture_output=True, text=True,
                          env=env, timeout=60, stdin=subprocess.DEVNULL)


def status(node):
    with node.client(headers=node.headers()) as c:
        r = c.get(P + "/status")
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture
def paired(tmp_path):
    nodes = make_pool(tmp_path, ["hub-a", "hub-b"])
    running = {name: n.start() for name, n in nodes.items()}
    pair(running["hub-a"], running["hub-b"])  # with a PIN: both sides sign
    for n in (running["hub-a"], running["hub-b"], running["hub-a"]):
        n.run(n.node.health.poll_once())
    yield running
    for n in running.values():
        n.stop()


def test_a_node_that_lost_its_node_secret_points_at_rotate_identity(paired):
    a, b = paired["hub-a"], paired["hub-b"]
    a.node.identity.secret_path.unlink()  # a wiped data directory over a kept database
    a = paired["hub-a"] = a.restarted()
    a.run(a.node.health.poll_once())

    s = status(a)
    assert s["localNode"]["identity"]["identityError"].startswith("stored pool private key could not be decrypted")
    peer = s["peers"][0]
    failure = peer["probeFailure"]
    assert failure["kind"] == "own_identity" and "this node cannot sign" in failure["detail"]
    # the action names the recovery and both real names, never a placeholder
    assert "`hubpool rotate-identity`" in failure["action"]
    assert f"`hubpool unpair {fqdn('hub-a')}` on {fqdn('hub-b')}" in failure["action"]
    assert "<" not in failure["action"]

    shown = cli(a, "status")
    assert shown.returncode == 0, shown.stderr
    assert "Peers this Hub cannot reach: its own pool key cannot be used" in shown.stdout
    assert "recover with `hubpool rotate-identity`" in shown.stdout and "cannot sign (own key)" in shown.stdout

    doctor = cli(a, "doctor", "--json")
    assert doctor.returncode == 1, doctor.stdout
    i1 = next(c for c in json.loads(doctor.stdout)["checks"] if c["id"] == "I1")
    assert i1["verdict"] == "needs action" and "could not be decrypted" in i1["detail"]
    assert i1["fix"].startswith("hubpool rotate-identity") and f"hubpool unpair {fqdn('hub-a')}" in i1["fix"]

    # and what it points at works: rotation re-seals a new key under the new node.secret
    with a.client(headers=a.headers()) as c:
        assert c.post(P + "/identity/rotate").status_code == 200
        checks = c.get(P + "/doctor").json()["checks"]
    assert status(a)["localNode"]["identity"]["identityError"] is None and a.node.identity.can_sign()
    assert next(c for c in checks if c["id"] == "I1")["verdict"] == "ready"


def test_doctor_f1_names_the_peer_that_refuses_this_node(paired):
    a, b = paired["hub-a"], paired["hub-b"]
    b.node.peers.delete(b.node.peers.by_fqdn(fqdn("hub-a")).id)  # hub-b forgot hub-a (its database reset)
    a.run(a.node.health.poll_once())
    result = cli(a, "doctor", "--json")
    assert result.returncode == 1, result.stdout
    checks = {c["id"]: c for c in json.loads(result.stdout)["checks"]}
    f1 = checks["F1"]
    assert f1["verdict"] == "needs action" and f1["title"] == f"Peer {fqdn('hub-b')}"
    assert f1["detail"] == "credentials refused (HTTP 401)"
    assert f"`hubpool unpair {fqdn('hub-b')}`" in f1["fix"] and "<peer>" not in f1["fix"]
    # the identity check is ready: this node's own key is fine, the fault is the peer's row
    assert checks["I1"]["verdict"] == "ready"
