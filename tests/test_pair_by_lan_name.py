"""`hubpool pair hub-b.lan --pin N` (issue 16 item 19): a name that is not a tailnet FQDN,
given with a PIN, is an address — the path `hubpool probe hub-b.lan` took and advised — not a
tailnet name to dial at https://hub-b.lan. Through the CLI against running nodes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from harness import fqdn, make_pool

P = "/api/inference/pool"
LAN_NAME = "hub-b.lan"


def cli(node, *args):
    env = {**os.environ, "HUB_POOL_DATA_DIR": str(node.env.data_dir), "HUB_POOL_LISTEN": f"127.0.0.1:{node.port}",
           "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "hubpool_core.cli", *args], capture_output=True, text=True,
                          env=env, timeout=60, stdin=subprocess.DEVNULL)


@pytest.fixture
def lan_resolver(monkeypatch):
    """The LAN's DNS, faked for the in-thread node: hub-b.lan answers 127.0.0.1 (the world
    faked, not the code: both the address check and the by-name dial resolve through it)."""
    real = socket.getaddrinfo

    def fake(host, *args, **kwargs):
        return real("127.0.0.1" if host == LAN_NAME else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", fake)


@pytest.fixture
def pool2(tmp_path):
    nodes = make_pool(tmp_path, ["hub-a", "hub-b"])
    for n in nodes.values():
        n.start()
    yield nodes
    for n in nodes.values():
        n.stop()


def peers_of(node) -> list[dict]:
    with node.client(headers=node.headers()) as c:
        return c.get(P + "/peers").json()


def test_a_lan_name_with_a_pin_is_paired_as_an_address(pool2, lan_resolver):
    a, b = pool2["hub-a"], pool2["hub-b"]
    probe = cli(a, "probe", LAN_NAME)
    # the probe checks the address rules: hub-b.lan resolves to loopback, refused without the dev switch
    assert probe.returncode != 0 and f"{LAN_NAME} resolves to 127.0.0.1" in probe.stdout + probe.stderr
    with b.client(headers=b.headers()) as c:
        pin = c.post(P + "/pairing-pin").json()["pin"]
    paired = cli(a, "pair", LAN_NAME, "--pin", pin, "--yes")
    said = paired.stdout + paired.stderr
    assert paired.returncode != 0
    # the same address rule answered, not a dial of https://hub-b.lan
    assert f"{LAN_NAME} resolves to 127.0.0.1" in said, said
    assert f"https://{LAN_NAME}" not in said
    assert peers_of(a) == []  # no pending row under a name that is not a tailnet name
    with b.client(headers=b.headers()) as c:  # refused before any call: B's PIN is unspent
        assert c.get(P + "/status").json()["pairingPin"]["active"] is True


def test_a_tailnet_name_with_a_pin_still_pairs_by_name(pool2):
    a, b = pool2["hub-a"], pool2["hub-b"]
    with b.client(headers=b.headers()) as c:
        pin = c.post(P + "/pairing-pin").json()["pin"]
    paired = cli(a, "pair", fqdn("hub-b"), "--pin", pin, "--yes")
    assert paired.returncode == 0, paired.stdout + paired.stderr
    assert [(r["nodeFqdn"], r["direction"]) for r in peers_of(a)] == [(fqdn("hub-b"), "outbound")]
