"""Discoverable peers: the merge, the /identify probe and the zero-call rule
(spec "Where pairing candidates come from").

No test here opens a socket: HTTP goes through httpx.MockTransport, and the zero-call test
also makes any socket connect or name lookup fail the test.
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from hubpool_portal import PortalDirectory
from hubpool_tailscale_admin import TailscaleAdminDirectory
from hubpool_tailscale_daemon import TailscaleDaemonDirectory

from hubpool_core.directory import Directory, DirectoryCandidate
from hubpool_core.peering.discovery import (
    IDENTIFY_PATH,
    MIN_PAIR_BY_ADDRESS_PROTOCOL,
    DiscoverablePeer,
    discover,
    merge_candidates,
    probe_identify,
)

STATUS_JSON = Path(__file__).parent / "data" / "tailscale_status.json"
SUFFIX = "example-tailnet.ts.net"

#: the directories whose is_tailnet is true, as the node computes them
TAILNET = frozenset({"tailscale_daemon", "tailscale_admin"})


def _run(coro):
    return asyncio.run(coro)


def _cand(name, source="tailscale_daemon", hostname="", device_id="", os=None, online=None):
    return DirectoryCandidate(node_fqdn=name, hostname=hostname, source=source,
                              device_id=device_id, os=os, online=online)


class FakeDirectory(Directory):
    """A directory with a chosen name and answer; records whether it was asked."""

    name = "fake"

    def __init__(self, name: str, answer=(), *, configured: bool = True, raises: Exception | None = None):
        super().__init__(SimpleNamespace())
        self.name = name  # instance attribute: one class stands in for every directory
        self.is_tailnet = name in TAILNET
        self._answer = list(answer)
        self._configured = configured
        self._raises = raises
        self.asked = 0

    def configured(self) -> bool:
        return self._configured

    async def candidates(self) -> list[DirectoryCandidate]:
        self.asked += 1
        if self._raises is not None:
            raise self._raises
        return list(self._answer)


class Recorder:
    """An httpx transport answering /identify per host from a table, recording every request."""

    def __init__(self, answers: dict[str, object] | None = None, delay: float = 0.0):
        self.answers = answers or {}
        self.delay = delay
        self.hosts: list[str] = []
        self.urls: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.hosts.append(request.url.host)
        self.urls.append(str(request.url))
        assert request.url.path.endswith(IDENTIFY_PATH)
        assert "authorization" not in request.headers  # /identify is asked with no credential
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            answer = self.answers.get(request.url.host, "connect-error")
            if answer == "connect-error":
                raise httpx.ConnectError("connection refused", request=request)
            if isinstance(answer, httpx.Response):
                return answer
            return httpx.Response(200, json=answer)
        finally:
            self.in_flight -= 1

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self))


CALLS: list[str] = []


def _forbidden_transport() -> httpx.MockTransport:
    """Fails the request AND records it: probe_identify answers "unreachable" for any error, so
    the zero-call tests check :data:`CALLS` too rather than rely on the raise alone."""
    def handler(request: httpx.Request) -> httpx.Response:
        CALLS.append(str(request.url))
        raise AssertionError(f"a network call was made: {request.method} {request.url}")
    return httpx.MockTransport(handler)


HUB = {"isCiHub": True, "poolProtocol": 2}


@pytest.fixture(autouse=True)
def _fresh_calls():
    CALLS.clear()


# ── merge_candidates ─────────────────────────────────────────────────────────

def test_a_tailnet_entry_wins_over_portal_whichever_came_first():
    portal = [_cand("hub-b.example.ts.net", "portal", hostname="Hub B (portal)", device_id="portal-dev-1",
                    os="linux", online=True)]
    daemon = [_cand("hub-b.example.ts.net", "tailscale_daemon", hostname="hub-b")]
    for lists in ([portal, daemon], [daemon, portal]):
        [peer] = merge_candidates(lists, TAILNET)
        assert peer.source is None
        assert peer.hostname == "hub-b"
        # the winner lacked all three, so all three are back-filled from the portal row
        assert peer.tailscaleDeviceId == "portal-dev-1"
        assert peer.os == "linux"
        assert peer.online is True


def test_back_fill_never_replaces_what_the_winner_has():
    daemon = [_cand("hub-b.example.ts.net", "tailscale_daemon", hostname="hub-b", device_id="nB2",
                    os="linux", online=False)]
    portal = [_cand("hub-b.example.ts.net", "portal", hostname="other", device_id="portal-dev-1",
                    os="windows", online=True)]
    [peer] = merge_candidates([portal, daemon], TAILNET)
    assert peer == DiscoverablePeer(tailscaleDeviceId="nB2", nodeFqdn="hub-b.example.ts.net",
                                    hostname="hub-b", source=None, os="linux", online=False)


def test_among_tailnet_entries_the_first_wins_and_is_back_filled():
    daemon = [_cand("hub-b.example.ts.net", "tailscale_daemon", hostname="hub-b", device_id="", online=True)]
    admin = [_cand("hub-b.example.ts.net", "tailscale_admin", hostname="hub-b-admin", device_id="nB2", os="linux",
                   online=False)]
    [peer] = merge_candidates([daemon, admin], TAILNET)
    assert (peer.hostname, peer.tailscaleDeviceId, peer.os, peer.online) == ("hub-b", "nB2", "linux", True)


def test_names_fold_on_the_normalised_fqdn():
    [peer] = merge_candidates([
        [_cand("HUB-B.example.ts.net.", "tailscale_daemon", hostname="hub-b")],
        [_cand("  hub-b.example.ts.net", "tailscale_admin", device_id="nB2")],
        [_cand("hub-b.EXAMPLE.ts.net", "portal", device_id="p1")],
    ], TAILNET)
    assert peer.nodeFqdn == "hub-b.example.ts.net"
    assert peer.tailscaleDeviceId == "nB2"
    assert peer.source is None


@pytest.mark.parametrize("name", [
    "100.64.0.2", "192.168.1.42", "192.168.1.42.", "fd7a:115c:a1e0::2", "[fd00::1]",
    "https://hub-b.example.ts.net", "hub-b.example.ts.net:443", "user@hub-b.example.ts.net",
    "hub-b", "", "   ", "hub_b.example.ts.net", "a" * 64 + ".ts.net",
])
def test_names_that_do_not_normalise_are_dropped(name):
    assert merge_candidates([[_cand(name, "portal"), _cand(name, "tailscale_admin")]], TAILNET) == []


def test_merge_is_sorted_and_folds_on_names_only():
    # Two rows with the same device id but different names stay two nodes: nothing but the
    # name is a fold key, so a far side cannot suppress a real node by claiming its id.
    merged = merge_candidates([
        [_cand("zeta.example.ts.net", device_id="same"), _cand("alpha.example.ts.net", device_id="same")],
        [_cand("mid.example.ts.net", "portal", device_id="same")],
    ], TAILNET)
    assert [p.nodeFqdn for p in merged] == ["alpha.example.ts.net", "mid.example.ts.net", "zeta.example.ts.net"]


def test_hostname_falls_back_to_the_first_label():
    [peer] = merge_candidates([[_cand("hub-b.example.ts.net", hostname="  ")]], TAILNET)
    assert peer.hostname == "hub-b"


def test_as_json_omits_unknowns_and_the_tailnet_source():
    tailnet = DiscoverablePeer(tailscaleDeviceId="", nodeFqdn="hub-b.example.ts.net", hostname="hub-b")
    assert tailnet.as_json() == {"tailscaleDeviceId": "", "nodeFqdn": "hub-b.example.ts.net", "hostname": "hub-b"}
    portal = DiscoverablePeer(tailscaleDeviceId="p1", nodeFqdn="hub-c.example.ts.net", hostname="hub-c",
                              source="portal", os="linux", online=False)
    assert portal.as_json() == {"tailscaleDeviceId": "p1", "nodeFqdn": "hub-c.example.ts.net",
                                "hostname": "hub-c", "source": "portal", "os": "linux", "online": False}


# ── probe_identify ───────────────────────────────────────────────────────────

def _probe(handler, timeout_s: float = 5.0) -> dict:
    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            return await probe_identify(http, "https://hub-b.example.ts.net/", timeout_s)
    return _run(go())


@pytest.mark.parametrize("response, expected", [
    (httpx.Response(200, json={"isCiHub": True, "poolProtocol": 2}),
     {"isCiHub": True, "poolProtocol": 2, "reason": None}),
    (httpx.Response(200, json={"isCiHub": True, "poolProtocol": 3}),
     {"isCiHub": True, "poolProtocol": 3, "reason": None}),
    # protocol 1 omits poolProtocol (older builds also sent nodeFqdn, which is ignored)
    (httpx.Response(200, json={"isCiHub": True, "nodeFqdn": "hub-b.example.ts.net"}),
     {"isCiHub": True, "poolProtocol": 1, "reason": "protocol_too_old"}),
    (httpx.Response(200, json={"isCiHub": True, "poolProtocol": 1}),
     {"isCiHub": True, "poolProtocol": 1, "reason": "protocol_too_old"}),
    (httpx.Response(200, json={"isCiHub": True, "poolProtocol": "2"}),
     {"isCiHub": True, "poolProtocol": 1, "reason": "protocol_too_old"}),
    (httpx.Response(404, text="Cannot GET /api/inference/pool/identify"),
     {"isCiHub": False, "poolProtocol": None, "reason": "not_a_hub"}),
    (httpx.Response(500, json={"isCiHub": True, "poolProtocol": 2}),
     {"isCiHub": False, "poolProtocol": None, "reason": "not_a_hub"}),
    (httpx.Response(302, headers={"Location": "http://169.254.169.254/"}),
     {"isCiHub": False, "poolProtocol": None, "reason": "not_a_hub"}),
    (httpx.Response(200, text="<html>router login</html>"),
     {"isCiHub": False, "poolProtocol": None, "reason": "not_a_hub"}),
    (httpx.Response(200, json={"isCiHub": "yes", "poolProtocol": 2}),
     {"isCiHub": False, "poolProtocol": None, "reason": "not_a_hub"}),
    (httpx.Response(200, json=[{"isCiHub": True}]),
     {"isCiHub": False, "poolProtocol": None, "reason": "not_a_hub"}),
    (httpx.Response(200, content=b'{"isCiHub": true, "pad": "' + b"x" * 100_000 + b'"}'),
     {"isCiHub": False, "poolProtocol": None, "reason": "not_a_hub"}),
])
def test_identify_verdicts(response, expected):
    seen = []

    def handler(request):
        seen.append(str(request.url))
        return response

    assert _probe(handler) == expected
    assert seen == ["https://hub-b.example.ts.net/api/inference/pool/identify"]  # redirect not followed


def test_a_pool_protocol_2_hub_is_pairable_by_address():
    assert MIN_PAIR_BY_ADDRESS_PROTOCOL == 2


@pytest.mark.parametrize("error", [httpx.ConnectError, httpx.ConnectTimeout, httpx.ReadTimeout,
                                   httpx.RemoteProtocolError])
def test_no_http_answer_is_unreachable(error):
    def handler(request):
        raise error("boom", request=request)

    assert _probe(handler) == {"isCiHub": False, "poolProtocol": None, "reason": "unreachable"}


def test_a_slow_answer_is_unreachable_within_the_timeout():
    async def handler(request):
        await asyncio.sleep(10)
        return httpx.Response(200, json=HUB)

    assert _probe(handler, timeout_s=0.05) == {"isCiHub": False, "poolProtocol": None, "reason": "unreachable"}


def test_probe_identify_never_raises_on_a_bad_base_url():
    def handler(request):
        raise AssertionError("not reached")

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            return await probe_identify(http, "not a url at all\x00")

    assert _run(go())["reason"] == "unreachable"


def test_probe_identify_sends_extra_headers():
    seen = {}

    def handler(request):
        seen.update(request.headers)
        return httpx.Response(200, json=HUB)

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            return await probe_identify(http, "http://192.168.1.42:5002", headers={"Host": "hub-b.lan:5002"})

    assert _run(go())["isCiHub"] is True
    assert seen["host"] == "hub-b.lan:5002"


# ── discover ─────────────────────────────────────────────────────────────────

def _daemon(cli: str | Path = STATUS_JSON) -> TailscaleDaemonDirectory:
    return TailscaleDaemonDirectory(SimpleNamespace(tailscale_cli=str(cli)))


def test_discover_from_the_recorded_tailscale_status():
    daemon = _daemon()
    status = _run(daemon.tailnet_status())
    assert status.connected and status.self_fqdn == f"hub-a.{SUFFIX}"

    # The Admin API lists every device, this node included; Portal names one already paired.
    admin = FakeDirectory("tailscale_admin", [
        _cand(f"HUB-A.{SUFFIX}.", "tailscale_admin", hostname="hub-a"),
        _cand(f"hub-b.{SUFFIX}", "tailscale_admin", hostname="hub-b-admin", device_id="admin-id"),
        _cand(f"hub-d.{SUFFIX}", "tailscale_admin", hostname="hub-d"),
    ])
    portal = FakeDirectory("portal", [_cand(f"hub-c.{SUFFIX}", "portal", hostname="hub-c")])
    recorder = Recorder({
        f"hub-b.{SUFFIX}": HUB,
        f"hub-d.{SUFFIX}": {"isCiHub": True},  # protocol 1: still offered, pairs by name
        f"pixel.{SUFFIX}": httpx.Response(404),
        # macbook: connection refused
    })

    async def go():
        async with recorder.client() as http:
            return await discover(
                [daemon, admin, portal],
                exclude={f"Hub-C.{SUFFIX}."},
                self_fqdn=status.self_fqdn,
                http=http,
                tailnet_connected=status.connected,
            )

    result = _run(go())
    # paired names and this node are never probed
    assert sorted(recorder.hosts) == sorted([f"hub-b.{SUFFIX}", f"hub-d.{SUFFIX}", f"macbook.{SUFFIX}",
                                             f"pixel.{SUFFIX}"])
    assert result["peers"] == [
        # the daemon (listed first) wins over the admin entry and keeps its own id and hostname
        {"tailscaleDeviceId": "nB2c3D4e5F6CNTRL", "nodeFqdn": f"hub-b.{SUFFIX}", "hostname": "hub-b",
         "os": "linux", "online": True},
        {"tailscaleDeviceId": "", "nodeFqdn": f"hub-d.{SUFFIX}", "hostname": "hub-d"},
    ]
    assert result["unanswered"] == [
        {"nodeFqdn": f"macbook.{SUFFIX}", "hostname": "macbook", "os": "macOS", "online": False,
         "reason": "unreachable"},
        {"nodeFqdn": f"pixel.{SUFFIX}", "hostname": "pixel", "os": "android", "online": True,
         "reason": "not_a_hub"},
    ]


def test_exclusion_happens_before_probing_and_peer_url_is_used():
    daemon = FakeDirectory("tailscale_daemon", [
        _cand("hub-a.example.ts.net"), _cand("hub-b.example.ts.net"), _cand("hub-c.example.ts.net"),
    ])
    recorder = Recorder({"127.0.0.1": HUB})
    urls: list[str] = []

    def peer_url(fqdn: str) -> str:
        urls.append(fqdn)
        return f"http://127.0.0.1:5002/{fqdn}"

    async def go():
        async with recorder.client() as http:
            return await discover([daemon], exclude={"HUB-B.example.ts.net", "not a name"},
                                  self_fqdn="Hub-A.Example.ts.net.", peer_url=peer_url, http=http,
                                  tailnet_connected=True)

    result = _run(go())
    assert urls == ["hub-c.example.ts.net"]
    assert recorder.urls == ["http://127.0.0.1:5002/hub-c.example.ts.net" + IDENTIFY_PATH]
    assert [p["nodeFqdn"] for p in result["peers"]] == ["hub-c.example.ts.net"]


def test_a_directory_that_raises_contributes_nothing_and_the_others_answer(caplog):
    broken = FakeDirectory("tailscale_admin", raises=RuntimeError("admin API down"))
    daemon = FakeDirectory("tailscale_daemon", [_cand("hub-b.example.ts.net")])
    recorder = Recorder({"hub-b.example.ts.net": HUB})

    async def go():
        async with recorder.client() as http:
            return await discover([broken, daemon], exclude=set(), self_fqdn=None, http=http,
                                  tailnet_connected=True)

    with caplog.at_level("DEBUG", logger="hubpool_core.peering.discovery"):
        result = _run(go())
    assert [p["nodeFqdn"] for p in result["peers"]] == ["hub-b.example.ts.net"]
    assert broken.asked == 1
    assert any("admin API down" in r.getMessage() and r.levelname == "DEBUG" for r in caplog.records)


def test_directories_and_probes_run_concurrently():
    names = [f"hub-{i}.example.ts.net" for i in range(6)]

    class Slow(FakeDirectory):
        running = 0
        most = 0

        async def candidates(self):
            Slow.running += 1
            Slow.most = max(Slow.most, Slow.running)
            await asyncio.sleep(0.05)
            Slow.running -= 1
            return await super().candidates()

    dirs = [Slow("tailscale_daemon", [_cand(n) for n in names[:3]]),
            Slow("tailscale_admin", [_cand(n, "tailscale_admin") for n in names[3:]])]
    recorder = Recorder({n: HUB for n in names}, delay=0.05)

    async def go():
        async with recorder.client() as http:
            return await discover(dirs, exclude=set(), self_fqdn=None, http=http, tailnet_connected=True)

    result = _run(go())
    assert len(result["peers"]) == 6
    assert Slow.most == 2
    assert recorder.max_in_flight == 6


def test_the_admin_leg_is_skipped_off_the_tailnet_and_asked_on_it():
    admin = FakeDirectory("tailscale_admin", [_cand("hub-b.example.ts.net", "tailscale_admin")])
    portal = FakeDirectory("portal", [_cand("hub-p.example.ts.net", "portal")])

    async def go(connected: bool, recorder: Recorder):
        async with recorder.client() as http:
            return await discover([admin, portal], exclude=set(), self_fqdn=None, http=http,
                                  tailnet_connected=connected)

    off = Recorder({"hub-p.example.ts.net": HUB})
    result = _run(go(False, off))
    assert admin.asked == 0
    assert [p["nodeFqdn"] for p in result["peers"]] == ["hub-p.example.ts.net"]
    assert result["peers"][0]["source"] == "portal"

    on = Recorder({"hub-b.example.ts.net": HUB, "hub-p.example.ts.net": HUB})
    result = _run(go(True, on))
    assert admin.asked == 1
    assert [p["nodeFqdn"] for p in result["peers"]] == ["hub-b.example.ts.net", "hub-p.example.ts.net"]


def test_unconfigured_directories_are_never_asked():
    unconfigured = FakeDirectory("portal", [_cand("hub-p.example.ts.net", "portal")], configured=False)

    async def go():
        async with httpx.AsyncClient(transport=_forbidden_transport()) as http:
            return await discover([unconfigured], exclude=set(), self_fqdn=None, http=http,
                                  tailnet_connected=True)

    assert _run(go()) == {"peers": [], "unanswered": []}
    assert CALLS == []
    assert unconfigured.asked == 0


@pytest.fixture
def no_sockets(monkeypatch):
    """Any outbound connection or name lookup fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"a network call was attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_no_tailnet_no_credential_no_portal_makes_zero_network_calls(tmp_path, no_sockets):
    # The daemon answers, but reports not connected and names nothing.
    stopped = tmp_path / "stopped.json"
    stopped.write_text(json.dumps({"BackendState": "Stopped", "Self": {"DNSName": ""}, "Peer": {}}))
    env = SimpleNamespace(tailscale_cli=str(stopped), tailscale_oauth_client_id="", tailscale_oauth_client_secret="",
                          portal_url="")
    daemon = TailscaleDaemonDirectory(env)
    admin = TailscaleAdminDirectory(env, transport=_forbidden_transport())
    portal = PortalDirectory(env)
    assert daemon.configured() and not admin.configured() and not portal.configured()

    async def go():
        status = await daemon.tailnet_status()
        assert status.connected is False
        async with httpx.AsyncClient(transport=_forbidden_transport()) as http:
            return await discover([daemon, admin, portal], exclude=set(), self_fqdn=status.self_fqdn,
                                  http=http, tailnet_connected=status.connected)

    assert _run(go()) == {"peers": [], "unanswered": []}
    assert CALLS == []


def test_no_tailscale_at_all_makes_zero_network_calls(tmp_path, no_sockets):
    env = SimpleNamespace(tailscale_cli=str(tmp_path / "missing.json"))
    daemon, admin, portal = TailscaleDaemonDirectory(env), TailscaleAdminDirectory(env), PortalDirectory(env)
    assert not (daemon.configured() or admin.configured() or portal.configured())

    async def go():
        async with httpx.AsyncClient(transport=_forbidden_transport()) as http:
            return await discover([daemon, admin, portal], exclude=set(), self_fqdn=None, http=http,
                                  tailnet_connected=False)

    assert _run(go()) == {"peers": [], "unanswered": []}
    assert CALLS == []


def test_an_admin_credential_off_the_tailnet_makes_zero_network_calls(no_sockets):
    # spec: the Admin API is queried with the tailnet the daemon reports, so a valid credential
    # on a node that has not joined a tailnet enumerates nothing (and dials nothing).
    env = SimpleNamespace(tailscale_oauth_client_id="id", tailscale_oauth_client_secret="secret")
    admin = TailscaleAdminDirectory(env, transport=_forbidden_transport())
    assert admin.configured()
    # The recorded daemon answer names peers, but this node is reported off the tailnet: the
    # daemon leg needs a connected tailnet too, so none of them is probed.
    daemon = _daemon()

    async def go():
        async with httpx.AsyncClient(transport=_forbidden_transport()) as http:
            return await discover([daemon, admin], exclude=set(), self_fqdn=None, http=http,
                                  tailnet_connected=False)

    assert _run(go()) == {"peers": [], "unanswered": []}
    assert CALLS == []
