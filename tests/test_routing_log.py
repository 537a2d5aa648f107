"""The routing log's cursor semantics and the kill switches, through a running node."""

from __future__ import annotations

import httpx
import pytest
from harness import RunningNode, fqdn, make_pool

from hubpool_sim import SimConfig, SimModel, run_in_thread

P = "/api/inference/pool"


def log(node, query=""):
    with node.client(headers=node.headers()) as c:
        r = c.get(P + "/routing-log" + query)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture
def node(tmp_path):
    with run_in_thread(SimConfig(flavor="ollama", models=[SimModel("m:1b")])) as sim, \
            RunningNode(tmp_path / "n", {"OLLAMA_URL": sim.url}) as n:
        yield n


def _send(node, count):
    ids = []
    for _ in range(count):
        r = httpx.post(node.url + "/api/chat", json={"model": "m:1b", "stream": False, "messages": []})
        ids.append(r.headers["x-hub-pool-request-id"])
    return ids


def test_since_is_inclusive_and_following_next_since_loses_nothing(node):
    ids = _send(node, 5)
    first = log(node)
    assert [e["id"] for e in first["entries"]] == ids[::-1]  # newest first
    assert first["matched"] == 5 and first["summary"]["recorded"] == 5
    cursor = first["nextSince"]
    again = log(node, f"?since={cursor.replace('+', '%2B')}")
    assert again["entries"] and again["entries"][0]["updatedAt"] == cursor  # the cursor row comes back
    more = _send(node, 3)
    seen = {e["id"] for e in log(node, f"?since={cursor}")["entries"]}
    assert set(more) <= seen


def test_a_cut_cursor_page_keeps_the_oldest_changes(node):
    ids = _send(node, 6)
    start = log(node, "?limit=1")
    assert start["matched"] == 6 and len(start["entries"]) == 1
    page = log(node, "?since=2000-01-01T00:00:00Z&limit=2")
    assert page["matched"] == 6 and [e["id"] for e in page["entries"]] == ids[:2][::-1]
    collected, since = [], "2000-01-01T00:00:00Z"
    for _ in range(10):
        page = log(node, f"?since={since}&limit=2")
        collected += [e["id"] for e in page["entries"]]
        if page["nextSince"] == since:
            break
        since = page["nextSince"]
    assert set(ids) <= set(collected)


@pytest.mark.parametrize("query", ["?limit=0", "?limit=10001", "?limit=x", "?since=2026-11-30T10:00:00",
                                   "?since=yesterday"])
def test_bad_cursor_arguments_are_400(node, query):
    with node.client(headers=node.headers()) as c:
        r = c.get(P + "/routing-log" + query)
    assert r.status_code == 400 and r.json()["error"]


def test_summary_says_when_the_log_restarted(node, tmp_path):
    s = log(node)["summary"]
    assert s["bootId"] and s["startedAt"] and s["capacity"] == 200


def test_ring_size_from_the_environment(tmp_path):
    with RunningNode(tmp_path / "n", {"HUB_POOL_ROUTING_LOG_SIZE": "5000"}) as n:
        assert log(n)["summary"]["capacity"] == 5000
    with RunningNode(tmp_path / "m", {"HUB_POOL_ROUTING_LOG_SIZE": "50"}) as n:
        assert log(n)["summary"]["capacity"] == 200


@pytest.mark.parametrize("env,expected", [
    ({"HUB_POOL_USER_DISABLED": "true"}, ("disabled_by_env", False, "env", "env")),
    ({"HUB_POOL_OUTBOUND_DISABLED": "true"}, ("partially_disabled", True, "env", None)),
    ({"HUB_POOL_INBOUND_DISABLED": "true"}, ("partially_disabled", True, None, "env")),
    ({"HUB_POOL_USER_DISABLED": "yes"}, ("no_peers", True, None, None)),  # only the literal "true" counts
])
def test_kill_switch_precedence(tmp_path, env, expected):
    with RunningNode(tmp_path / "n", env) as n, n.client(headers=n.headers()) as c:
        c.patch(P + "/settings", json={"poolEnabled": True, "poolOutboundEnabled": True})
        status = c.get(P + "/status").json()
    reason, enabled, out_by, in_by = expected
    assert status["reason"] == reason and status["enabled"] is enabled
    assert status["directions"]["outbound"]["disabledBy"] == out_by
    assert status["directions"]["inbound"]["disabledBy"] == in_by


def test_env_master_beats_the_setting_and_blocks_pairing(tmp_path):
    nodes = make_pool(tmp_path, ["hub-a", "hub-b"], per_node={"hub-b": {"HUB_POOL_USER_DISABLED": "true"}})
    a, b = nodes["hub-a"].start(), nodes["hub-b"].start()
    try:
        with b.client(headers=b.headers()) as c:
            c.patch(P + "/settings", json={"poolEnabled": True})
            assert c.get(P + "/status").json()["disabledBy"] == "env"
            r = c.post(P + "/pairing-pin")
            assert r.status_code == 503 and "HUB_POOL_USER_DISABLED" in r.json()["error"]
        with a.client(headers=a.headers()) as c:
            r = c.post(P + "/peers/pair", json={"nodeFqdn": fqdn("hub-b")})
        assert r.status_code == 400 and "HUB_POOL_USER_DISABLED" in r.json()["error"]
    finally:
        a.stop()
        b.stop()


def test_local_forward_refusals_are_503_when_inbound_is_off_never_403(tmp_path):
    from hubpool_core.peering.signing import sign_headers

    nodes = make_pool(tmp_path, ["hub-a", "hub-b"])
    a, b = nodes["hub-a"].start(), nodes["hub-b"].start()
    try:
        with b.client(headers=b.headers()) as c:
            pin = c.post(P + "/pairing-pin").json()["pin"]
        with a.client(headers=a.headers()) as c:
            c.post(P + "/peers/pair", json={"nodeFqdn": fqdn("hub-b"), "pin": pin})
        with b.client(headers=b.headers()) as c:
            c.post(P + f"/peers/{fqdn('hub-a')}/approve")
            c.patch(P + "/settings", json={"poolInboundEnabled": False})

        def forward(headers_extra):
            kp = a.node.identity.get()
            path = P + "/local/api/chat"
            h = sign_headers(kp, "POST", path, kp.node_uuid, fqdn("hub-a"), b.node.identity.get().node_uuid, None)
            return httpx.post(b.url + path, json={"model": "x", "messages": []}, headers={**h, **headers_extra})

        r = forward({"X-Hub-Pool-Backend": "ollama", "X-Hub-Pool-Request-Id": "req-1"})
        assert r.status_code == 503 and "inbound pooling is switched off" in r.json()["error"]
        assert "x-hub-pool-backend" not in r.headers  # this node's own refusal carries no mark
        with b.client(headers=b.headers()) as c:
            c.patch(P + "/settings", json={"poolInboundEnabled": True})
            c.post(P + f"/peers/{fqdn('hub-a')}/disable")
        r = forward({"X-Hub-Pool-Backend": "ollama"})
        assert r.status_code == 503 and "disabled this peer" in r.json()["error"]
        with b.client(headers=b.headers()) as c:
            c.post(P + f"/peers/{fqdn('hub-a')}/enable")
        r = forward({"X-Hub-Pool-Backend": "nonsense"})
        assert r.status_code == 400 and r.json()["error"] == "Missing or invalid X-Hub-Pool-Backend header"
        rows = log(b)["entries"]
        assert any(e["id"] == "req-1" and e["direction"] == "inbound" and e["status"] == 503 for e in rows)
        assert httpx.post(b.url + P + "/local/api/chat", json={}).status_code == 401
    finally:
        a.stop()
        b.stop()
