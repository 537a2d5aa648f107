"""`hubpool pair hub-b.lan --pin N` (issue 16 item 19): a name that is not a tailnet FQDN,
given with a PIN, is an address — the path `hubpool probe hub-b.lan` took and advised — not a
tailnet name to dial at https://hub-b.lan. Through the CLI against running nodes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from harness import RunningNode, bound_socket, fqdn, make_pool, tailnet_status_for

P = "/api/inference/pool"
LAN_NAME = "hub-b.lan"


def cli(node, *args):
    env = {**os.environ, "HUB_POOL_DATA_DIR": str(node.env.data_dir), "HUB_POOL_LISTEN": f"127.0.0.1:{node.port}",
           "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "hubpool_core.cli", *args], capture_output=True, text=True,
                          env=env, timeout=60, stdin=subprocess.DEVNULL)


def resolve_lan_name(monkeypatch, ip: str) -> None:
    """The LAN's DNS, faked for the in-thread nodes: hub-b.lan answers ``ip`` (the world faked,
    not the code: both the address check and the by-name dial resolve through it)."""
    real = socket.getaddrinfo

    def fake(host, *args, **kwargs):
        return real(ip if host == LAN_NAME else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", fake)


@pytest.fixture
def lan_resolver(monkeypatch):
    resolve_lan_name(monkeypatch, "127.0.0.1")


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


def test_a_lan_name_with_a_pin_pairs_end_to_end(tmp_path, monkeypatch):
    """hub-b listens where its LAN name points, on the default port pairing by address tries
    first (5002), on a loopback address of its own; the dev switch admits loopback peers."""
    lan_ip = "127.0.0.77"
    b_sock = socket.socket()
    b_sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        b_sock.bind((lan_ip, 5002))
    except OSError as exc:  # pragma: no cover - another process holds exactly this address
        b_sock.close()
        pytest.skip(f"{lan_ip}:5002 is taken here ({exc})")
    a_sock = bound_socket()
    urls = {fqdn("hub-a"): f"http://127.0.0.1:{a_sock.getsockname()[1]}", fqdn("hub-b"): f"http://{lan_ip}:5002"}
    env = {}
    for name in ("hub-a", "hub-b"):
        status_file = tmp_path / f"{name}-tailscale.json"
        status_file.write_text(json.dumps(tailnet_status_for(name)))
        env[name] = {"HUB_POOL_TAILSCALE_CLI": str(status_file), "HUB_POOL_PEER_URLS": json.dumps(urls),
                     "HUB_POOL_DEV_ALLOW_LOOPBACK_PEERS": "true"}
    env["hub-b"]["HUB_POOL_LISTEN"] = f"{lan_ip}:5002"
    a = RunningNode(tmp_path / "hub-a", env["hub-a"], sock=a_sock)
    b = RunningNode(tmp_path / "hub-b", env["hub-b"], sock=b_sock)
    b.url = f"http://{lan_ip}:5002"
    resolve_lan_name(monkeypatch, lan_ip)
    with a, b:
        assert "a Hub answers at hub-b.lan" in cli(a, "probe", LAN_NAME).stdout
        with b.client(headers=b.headers()) as c:
            pin = c.post(P + "/pairing-pin").json()["pin"]
        paired = cli(a, "pair", LAN_NAME, "--pin", pin, "--yes")
        assert paired.returncode == 0, paired.stdout + paired.stderr
        assert f"Request sent to {fqdn('hub-b')}" in paired.stdout  # the PIN exchange named it
        with b.client(headers=b.headers()) as c:
            assert c.post(P + f"/peers/{fqdn('hub-a')}/approve").status_code == 200
        assert [(r["nodeFqdn"], r["status"]) for r in peers_of(a)] == [(fqdn("hub-b"), "connected")]
