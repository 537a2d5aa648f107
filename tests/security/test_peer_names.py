"""Names a peer teaches this node must be names on this tailnet (issue 26 item 4).

A node dials a peer at ``https://<its name>`` for every forward and control call, so a name it
learns from a peer decides where its traffic goes. Two ways a peer teaches one: a signed request
under a new ``X-Hub-Pool-Peer`` (identity beats address: the health tick renames the row), and
the answer to a pairing request sent by address. Before issue 26 neither was checked: a paired
peer signing as ``evil.example.com`` was renamed to it on the next tick, and pairing by address
stored whatever name the far side answered. Now both pass the checks a pairing request's own
name passes: under this tailnet's MagicDNS suffix and, with an Admin API credential, one of the
tailnet's devices (the fake Admin API of test_admin_api_membership.py).
"""

from __future__ import annotations

import logging

import httpx
import pytest
from aiohttp import web
from aiohttp_thread import ThreadedApp
from harness import fqdn, make_pool, pair
from nacl.signing import SigningKey
from test_admin_api_membership import TAILNET, api, credentials  # noqa: F401 - api is a fixture

from hubpool_core.peering.signing import sign_headers, spki_from_verify_key

P = "/api/inference/pool"
OFF_TAILNET = "evil.example.com"
UNLISTED = "hub-b-twin.example-tailnet.ts.net"  # under the suffix, not a device of the tailnet
LISTED = "hub-b-moved.example-tailnet.ts.net"


@pytest.fixture
def pool(tmp_path, api):  # noqa: F811 - the Admin API fixture imported above
    """hub-a (holding an Admin API credential) paired with hub-b by PIN: both sign."""
    api.tailnets = {TAILNET: [fqdn("hub-a"), fqdn("hub-b"), LISTED]}
    nodes = make_pool(tmp_path, ["hub-a", "hub-b"], {"HUB_POOL_DEV_ALLOW_LOOPBACK_PEERS": "true"},
                      per_node={"hub-a": credentials(api)})
    a, b = nodes["hub-a"].start(), nodes["hub-b"].start()
    pair(a, b)
    b.run(b.node.health.poll_once())  # hub-b signs to hub-a: its row there is seen signing
    yield a, b
    a.stop()
    b.stop()


def _signed_as(b, a, name: str) -> int:
    """hub-b's genuine signature on a capabilities call, claiming ``name``: hub-a's answer."""
    kp = b.node.identity.get()
    headers = sign_headers(kp, "GET", P + "/capabilities", kp.node_uuid, name, a.node.identity.get().node_uuid,
                           None)
    return httpx.get(a.url + P + "/capabilities", headers=headers, timeout=30).status_code


def _names(a) -> set[str]:
    return {r.node_fqdn for r in a.node.peers.all()}


def test_a_peer_signing_under_a_name_off_the_tailnet_is_not_renamed(pool, caplog):
    a, b = pool
    for bad in (OFF_TAILNET, UNLISTED):
        assert _signed_as(b, a, bad) == 200  # the signature is genuine: the request is admitted
        with caplog.at_level(logging.DEBUG, logger="hubpool.health"):
            for _ in range(2):
                a.run(a.node.health.tick())
                a.run(a.node.health.wait_probes())
        assert _names(a) == {fqdn("hub-b")}, bad
        said = [r for r in caplog.records if f"signs its requests as {bad}; not renaming it" in r.getMessage()]
        assert said and said[0].levelno == logging.WARNING, bad
    assert "not under this tailnet's MagicDNS suffix" in caplog.text
    assert "is not a device of this tailnet" in caplog.text
    # hub-a still reaches hub-b where it always did: its probes pass
    a.run(a.node.health.poll_once())
    assert a.node.health.failures == {}
    # a name that is a device of this tailnet is still a rename (identity beats address)
    a.node.peer_urls[LISTED] = b.url
    assert _signed_as(b, a, LISTED) == 200
    a.run(a.node.health.tick())
    assert _names(a) == {LISTED}


class FakeHub:
    """A Hub on the LAN written from the wire facts: it answers a PIN request with a valid
    identity and whatever tailnet name the test gives it."""

    def __init__(self, name: str):
        self.name = name
        self.key = SigningKey.generate()
        app = web.Application()
        app.router.add_post(P + "/pair/request", self.request)
        self.server = ThreadedApp(app)

    async def request(self, _request: web.Request) -> web.Response:
        return web.json_response({"received": True, "nodeFqdn": self.name,
                                  "nodeUuid": "5c0ffee0-1234-4abc-8def-0123456789ab",
                                  "publicKey": spki_from_verify_key(self.key.verify_key)})


@pytest.mark.parametrize(("name", "why"), [(OFF_TAILNET, "not under this tailnet's MagicDNS suffix"),
                                           (UNLISTED, "is not a device of this tailnet")])
def test_pairing_by_address_refuses_an_answer_naming_a_device_off_the_tailnet(pool, name, why):
    a, _ = pool
    with FakeHub(name).server as hub:
        with a.client(headers=a.headers()) as c:
            r = c.post(P + "/peers/pair", json={"address": f"127.0.0.1:{hub.port}", "pin": "123456"})
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith(f"The Hub at http://127.0.0.1:{hub.port} says its tailnet name is {name}")
    assert why in r.json()["error"] and "Nothing was stored here" in r.json()["error"]
    assert _names(a) == {fqdn("hub-b")}


def test_pairing_by_address_stores_an_answer_naming_a_device_of_the_tailnet(pool):
    a, _ = pool
    with FakeHub(LISTED).server as hub:
        with a.client(headers=a.headers()) as c:
            r = c.post(P + "/peers/pair", json={"address": f"127.0.0.1:{hub.port}", "pin": "123456"})
    assert r.status_code == 200 and r.json()["nodeFqdn"] == LISTED, r.text
    assert _names(a) == {fqdn("hub-b"), LISTED}
