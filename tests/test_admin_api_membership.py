"""The pairing membership layer against a fake Tailscale Admin API (a real HTTP server),
through running nodes, up and down (issue 16 item 20): the API is asked about the tailnet the
local daemon reports, not the credential's default (`-`); an API that does not answer lets
pairing fall back to the MagicDNS suffix and says so at WARNING and in doctor's D1."""

from __future__ import annotations

import logging

import pytest
from aiohttp import web
from aiohttp_thread import ThreadedApp
from harness import closed_port_url, fqdn, make_pool, wait_until

P = "/api/inference/pool"
TAILNET = "operator@example.com"  # CurrentTailnet.Name in tests/data/tailscale_status.json


class FakeAdminApi:
    """OAuth client-credentials exchange and per-tailnet device lists, as api.tailscale.com
    answers them; ``down`` makes every call a 503."""

    def __init__(self) -> None:
        self.tailnets: dict[str, list[str]] = {}
        self.down = False
        self.asked: list[str] = []
        app = web.Application()
        app.router.add_post("/api/v2/oauth/token", self.token)
        app.router.add_get("/api/v2/tailnet/{tailnet}/devices", self.devices)
        self.server = ThreadedApp(app)

    async def token(self, request: web.Request) -> web.Response:
        if self.down:
            return web.json_response({"message": "unavailable"}, status=503)
        form = await request.post()
        if form.get("client_id") != "cid" or form.get("client_secret") != "secret":
            return web.json_response({"message": "bad credentials"}, status=401)
        return web.json_response({"access_token": "tok", "token_type": "Bearer", "expires_in": 3600})

    async def devices(self, request: web.Request) -> web.Response:
        self.asked.append(request.raw_path)
        if self.down:
            return web.json_response({"message": "unavailable"}, status=503)
        if request.headers.get("Authorization") != "Bearer tok":
            return web.json_response({"message": "unauthorized"}, status=401)
        names = self.tailnets.get(request.match_info["tailnet"])
        if names is None:
            return web.json_response({"message": "tailnet not found"}, status=404)
        return web.json_response({"devices": [{"name": n + ".", "hostname": n.split(".")[0], "nodeId": n}
                                              for n in names]})


@pytest.fixture
def api():
    fake = FakeAdminApi()
    with fake.server:
        yield fake


def credentials(api: FakeAdminApi) -> dict[str, str]:
    """The environment that gives a node an Admin API credential for ``api``."""
    return {"TAILSCALE_OAUTH_CLIENT_ID": "cid", "TAILSCALE_OAUTH_CLIENT_SECRET": "secret",
            "HUB_POOL_TAILSCALE_API_URL": api.server.url}


@pytest.fixture
def pool(tmp_path, api):
    """hub-a and hub-b; hub-b holds an Admin API credential and checks membership with it."""
    nodes = make_pool(tmp_path, ["hub-a", "hub-b"], per_node={"hub-b": credentials(api)})
    for n in nodes.values():
        n.start()
    yield nodes
    for n in nodes.values():
        n.stop()


def ask_to_pair(a, b):
    with a.client(headers=a.headers()) as c:
        return c.post(P + "/peers/pair", json={"nodeFqdn": fqdn("hub-b")})


def doctor(node) -> dict[str, dict]:
    with node.client(headers=node.headers()) as c:
        return {c["id"]: c for c in c.get(P + "/doctor").json()["checks"]}


def test_membership_is_asked_of_the_tailnet_the_daemon_reports(pool, api):
    a, b = pool["hub-a"], pool["hub-b"]
    # the credential's default tailnet ("-") is another one, where hub-a is not a device
    api.tailnets = {TAILNET: [fqdn("hub-a"), fqdn("hub-b")], "-": ["someone-else.other.ts.net"]}
    r = ask_to_pair(a, b)
    assert r.status_code == 200, r.text
    assert api.asked and set(api.asked) == {"/api/v2/tailnet/operator%40example.com/devices"}
    assert [row.node_fqdn for row in b.node.peers.all()] == [fqdn("hub-a")]
    assert "D1" not in doctor(b)  # the API answers: nothing to warn about


def test_a_name_the_tailnet_does_not_list_is_refused(pool, api):
    a, b = pool["hub-a"], pool["hub-b"]
    api.tailnets = {TAILNET: [fqdn("hub-b")], "-": [fqdn("hub-a"), fqdn("hub-b")]}
    r = ask_to_pair(a, b)
    assert r.status_code == 400 and "only accepted from devices on this tailnet" in r.json()["error"], r.text
    assert b.node.peers.all() == []


def test_an_unreachable_admin_api_is_a_visible_warning_and_pairing_falls_back(pool, api, caplog):
    a, b = pool["hub-a"], pool["hub-b"]
    api.tailnets = {TAILNET: [fqdn("hub-a"), fqdn("hub-b")]}
    api.down = True
    with caplog.at_level(logging.DEBUG):
        r = ask_to_pair(a, b)
    assert r.status_code == 200, r.text  # degraded to the suffix check, not blocked
    warned = [rec for rec in caplog.records if rec.name.startswith("hubpool_tailscale_admin")
              and rec.levelno == logging.WARNING]
    assert len(warned) == 1, [rec.getMessage() for rec in caplog.records if "tailscale_admin" in rec.name]
    assert ("the Admin API is unavailable: the OAuth token exchange answered HTTP 503; pairing checks only the "
            "MagicDNS suffix") in warned[0].getMessage()
    d1 = doctor(b)["D1"]
    assert d1["verdict"] == "warning"
    assert "tailscale_admin: the Admin API is unavailable: the OAuth token exchange answered HTTP 503" in d1["detail"]
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        doctor(b)  # the same failure again: the log does not repeat it at WARNING
    assert not [rec for rec in caplog.records if rec.name.startswith("hubpool_tailscale_admin")
                and rec.levelno >= logging.WARNING]
    # the API comes back: doctor's warning clears
    api.down = False
    assert wait_until(lambda: "D1" not in doctor(b), timeout=10)


def test_an_admin_api_nothing_listens_on_is_the_same_warning(tmp_path, caplog):
    dead = closed_port_url()
    creds = {"TAILSCALE_OAUTH_CLIENT_ID": "cid", "TAILSCALE_OAUTH_CLIENT_SECRET": "secret",
             "HUB_POOL_TAILSCALE_API_URL": dead}
    nodes = make_pool(tmp_path, ["hub-a", "hub-b"], per_node={"hub-b": creds})
    for n in nodes.values():
        n.start()
    try:
        with caplog.at_level(logging.DEBUG):
            r = ask_to_pair(nodes["hub-a"], nodes["hub-b"])
        assert r.status_code == 200, r.text
        assert any(rec.levelno == logging.WARNING and f"ConnectError reaching {dead}" in rec.getMessage()
                   for rec in caplog.records if rec.name.startswith("hubpool_tailscale_admin"))
        d1 = doctor(nodes["hub-b"])["D1"]
        assert d1["verdict"] == "warning" and f"ConnectError reaching {dead}" in d1["detail"]
    finally:
        for n in nodes.values():
            n.stop()
