"""GET/PATCH /api/inference/pool/settings through a running node."""

from __future__ import annotations

import json

import pytest

P = "/api/inference/pool/settings"

DEFAULTS = {
    "poolEnabled": True, "poolOutboundEnabled": True, "poolInboundEnabled": True, "poolLocalAffinity": 1,
    "poolHealthPollSeconds": 30, "poolPins": [], "poolRequireSignedPeers": False,
    "poolShareContainerStats": True, "poolPressureWeight": 0, "poolMaxPromptTokens": None,
    "poolProbeSnapshotTtlMs": 0, "poolPrefixAffinityMaxInFlight": 0, "poolSlotAwareness": 0,
}


def test_defaults_are_the_spec_table(node):
    with node.client(headers=node.headers()) as c:
        got = c.get(P).json()
    assert {k: got[k] for k in DEFAULTS} == DEFAULTS


def test_patch_persists_and_survives_restart(tmp_path):
    from harness import RunningNode

    with RunningNode(tmp_path / "n") as n, n.client(headers=n.headers()) as c:
        r = c.patch(P, json={"poolLocalAffinity": 3, "poolMaxPromptTokens": 16000})
        assert r.status_code == 200 and r.json()["poolLocalAffinity"] == 3
    assert json.loads((tmp_path / "n" / "settings.json").read_text())["poolLocalAffinity"] == 3
    with RunningNode(tmp_path / "n") as n, n.client(headers=n.headers()) as c:
        got = c.get(P).json()
        assert got["poolLocalAffinity"] == 3 and got["poolMaxPromptTokens"] == 16000
        assert c.patch(P, json={"poolMaxPromptTokens": None}).json()["poolMaxPromptTokens"] is None


@pytest.mark.parametrize("key,value,range_text", [
    ("poolLocalAffinity", 21, "0–20"),
    ("poolLocalAffinity", -1, "0–20"),
    ("poolHealthPollSeconds", 5, "10–300"),
    ("poolPressureWeight", 4, "0–3"),
    ("poolMaxPromptTokens", 1000, "1024–1048576, or null"),
    ("poolProbeSnapshotTtlMs", 300_001, "0–300000"),
    ("poolSlotAwareness", 2, "0–1"),
    ("poolEnabled", "yes", "true or false"),
    ("poolLocalAffinity", "3", "0–20"),
])
def test_out_of_range_is_422_naming_key_and_range(node, key, value, range_text):
    with node.client(headers=node.headers()) as c:
        before = c.get(P).json()
        r = c.patch(P, json={"poolHealthPollSeconds": 60, key: value})
        assert r.status_code == 422
        err = r.json()
        assert key in err["error"] and range_text in err["error"]
        assert err["errors"][0]["key"] == key
        assert c.get(P).json() == before  # nothing half-written


def test_unknown_key_and_pins_are_refused(node):
    with node.client(headers=node.headers()) as c:
        assert c.patch(P, json={"poolNope": 1}).status_code == 422
        r = c.patch(P, json={"poolPins": []})
        assert r.status_code == 422 and "pins" in r.json()["error"]
        assert c.patch(P, content=b"{nope").status_code == 400
        assert c.patch(P, json=[1]).status_code == 400
