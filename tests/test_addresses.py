"""The by-address SSRF guard (spec "Finding a peer by address").

Every refusal must happen before any connection: the resolver is injected, and the HTTP
transport handed to the probe fails the test if it is ever called. The only real socket any
test here opens is a local server on 127.0.0.1, reached through the loopback development switch.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hubpool_core.peering.addresses import (
    ADDRESS_MAX_LENGTH,
    DEFAULT_PORTS,
    DEV_ALLOW_LOOPBACK_ENV,
    AddressRefused,
    AddressUnresolvable,
    ProbeTarget,
    candidate_urls,
    is_allowed_peer_ip,
    parse_address,
    resolve_checked,
)
from hubpool_core.peering.discovery import probe_identify


def _run(coro):
    return asyncio.run(coro)


def _fake_resolver(answers: dict[str, list[str]], calls: list[str] | None = None):
    async def resolve(host: str) -> list[str]:
        if calls is not None:
            calls.append(host)
        if host not in answers:
            raise OSError(-2, "Name or service not known")
        return answers[host]
    return resolve


async def _never_resolve(host: str) -> list[str]:
    raise AssertionError(f"the resolver was called for {host!r}")


def _failing_transport(calls: list[str]) -> httpx.MockTransport:
    # Records as well as raises: probe_identify answers "unreachable" for any transport error,
    # so the raise alone could be swallowed; the test checks ``calls`` afterwards.
    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(str(request.url))
        raise AssertionError(f"a connection was attempted to {request.url}")
    return httpx.MockTransport(handler)


# ── is_allowed_peer_ip ───────────────────────────────────────────────────────

ALLOWED = [
    "10.1.2.3", "10.0.0.0", "10.255.255.255",
    "172.16.0.1", "172.31.255.255",
    "192.168.1.42", "192.168.255.255",
    "100.64.0.1", "100.127.255.254",
    "fd00::1", "fc00::1", "fdff:ffff::1", "fd7a:115c:a1e0::1",
    "::ffff:192.168.1.1", "::ffff:10.0.0.1",
]
REFUSED = [
    "172.32.0.1", "172.15.255.255",
    "100.128.0.1", "100.63.255.255",
    "fe80::1", "169.254.169.254", "169.254.0.1",
    "127.0.0.1", "127.8.9.10", "::1",
    "8.8.8.8", "1.1.1.1", "2001:4860:4860::8888",
    "0.0.0.0", "::",
    "224.0.0.1", "ff02::1", "239.255.255.250",
    "255.255.255.255", "240.0.0.1",
    "::ffff:8.8.8.8", "::ffff:127.0.0.1", "::ffff:169.254.169.254",
    "64:ff9b::808:808", "2002:c0a8:0101::1",  # NAT64 / 6to4 wrappers are not unwrapped: refused
    "not-an-ip", "", "192.168.1", "[fd00::1",
]


@pytest.mark.parametrize("ip", ALLOWED)
def test_private_lan_tailnet_and_ula_addresses_are_allowed(ip):
    assert is_allowed_peer_ip(ip)
    assert is_allowed_peer_ip(ipaddress.ip_address(ip))


@pytest.mark.parametrize("ip", REFUSED)
def test_everything_else_is_refused(ip):
    assert not is_allowed_peer_ip(ip)


@pytest.mark.parametrize("ip", ["127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1"])
def test_loopback_only_with_the_development_switch(ip):
    assert not is_allowed_peer_ip(ip)
    assert is_allowed_peer_ip(ip, allow_loopback=True)


@pytest.mark.parametrize("ip", ["169.254.169.254", "fe80::1", "8.8.8.8", "0.0.0.0"])
def test_the_development_switch_admits_loopback_and_nothing_else(ip):
    assert not is_allowed_peer_ip(ip, allow_loopback=True)


def test_the_development_switch_is_named_for_the_caller():
    assert DEV_ALLOW_LOOPBACK_ENV == "HUB_POOL_DEV_ALLOW_LOOPBACK_PEERS"


# A reference built independently from ipaddress networks.
_REF_ALLOWED = [ipaddress.ip_network(n) for n in
                ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")]
_REF_LOOPBACK = [ipaddress.ip_network(n) for n in ("127.0.0.0/8", "::1/128")]


def _reference(ip, allow_loopback: bool) -> bool:
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    nets = _REF_ALLOWED + (_REF_LOOPBACK if allow_loopback else [])
    return any(ip.version == net.version and ip in net for net in nets)


_mapped = st.ip_addresses(v=4).map(lambda a: ipaddress.IPv6Address(f"::ffff:{a}"))
_any_ip = st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6), _mapped)


@given(ip=_any_ip, allow_loopback=st.booleans())
def test_is_allowed_peer_ip_agrees_with_the_reference(ip, allow_loopback):
    expected = _reference(ip, allow_loopback)
    assert is_allowed_peer_ip(ip, allow_loopback=allow_loopback) is expected
    assert is_allowed_peer_ip(str(ip), allow_loopback=allow_loopback) is expected


# ── parse_address ────────────────────────────────────────────────────────────

@pytest.mark.parametrize("text, host, port, display", [
    ("192.168.1.42", "192.168.1.42", None, "192.168.1.42"),
    ("192.168.1.42:5002", "192.168.1.42", 5002, "192.168.1.42:5002"),
    ("  192.168.1.42:3000 ", "192.168.1.42", 3000, "192.168.1.42:3000"),
    ("[fd00::1]:5002", "fd00::1", 5002, "[fd00::1]:5002"),
    ("[FD00:0::1]", "fd00::1", None, "[fd00::1]"),
    ("fd00::1", "fd00::1", None, "[fd00::1]"),
    ("::ffff:192.168.1.1", "::ffff:c0a8:101", None, "[::ffff:c0a8:101]"),
    ("hub-b.lan", "hub-b.lan", None, "hub-b.lan"),
    ("Hub-B.LAN.:3000", "hub-b.lan", 3000, "hub-b.lan:3000"),
    ("hub-b", "hub-b", None, "hub-b"),
    ("hub-b.example-tailnet.ts.net:5002", "hub-b.example-tailnet.ts.net", 5002, "hub-b.example-tailnet.ts.net:5002"),
])
def test_parse_address_accepts_host_and_optional_port(text, host, port, display):
    assert parse_address(text) == ProbeTarget(host=host, port=port, display=display)


@pytest.mark.parametrize("text, words", [
    ("", "Give the other Hub's address"),
    ("   ", "Give the other Hub's address"),
    ("http://x", "without a scheme"),
    ("https://192.168.1.42:5002/", "without a scheme"),
    ("user@x", "credentials"),
    ("user:pass@192.168.1.42", "credentials"),
    ("x/path", "no path"),
    ("192.168.1.42:5002/api", "no path"),
    ("x\\path", "no path"),
    ("x?y", "query"),
    ("x#y", "fragment"),
    ("hub b.lan", "spaces"),
    ("hub-b.lan:0", "port"),
    ("hub-b.lan:65536", "port"),
    ("hub-b.lan:http", "port"),
    ("hub-b.lan:", "port"),
    (":5002", "no host"),
    ("fd00::1:5002:x", "brackets"),
    ("[fd00::1", "bracket"),
    ("[hub-b.lan]:5002", "brackets are only for IPv6"),
    ("[fd00::1]5002", "only :port"),
    ("fe80::1%eth0", "zone index"),
    ("hub_b.lan", "valid host name"),
    ("-hub.lan", "valid host name"),
    ("a" * 64 + ".lan", "valid host name"),
    ("192.168.1", "IPv4"),
    ("127.1", "IPv4"),
    ("2130706433", "IPv4"),
    ("0x7f000001", "IPv4"),
    ("192.168.001.042", "IPv4"),
    ("x" * (ADDRESS_MAX_LENGTH + 1), "longer than 300"),
])
def test_parse_address_refuses_with_a_sentence(text, words):
    with pytest.raises(ValueError) as caught:
        parse_address(text)
    message = str(caught.value)
    assert words.lower() in message.lower()
    assert message[0].isupper() or message[0] in "'[", message


def test_parse_address_refuses_non_text():
    with pytest.raises(ValueError):
        parse_address(None)  # type: ignore[arg-type]


@given(ip=st.ip_addresses(), port=st.one_of(st.none(), st.integers(1, 65535)))
def test_parse_address_round_trips_any_ip_literal(ip, port):
    text = (f"[{ip}]" if ip.version == 6 else str(ip)) + (f":{port}" if port else "")
    target = parse_address(text)
    assert target.host == str(ip)
    assert target.port == port
    assert target.ip_literal == ip
    assert parse_address(target.display) == target


def test_host_header_names_the_target_as_typed():
    assert parse_address("hub-b.lan").host_header(5002) == "hub-b.lan:5002"
    assert parse_address("[fd00::1]").host_header(3000) == "[fd00::1]:3000"
    assert parse_address("hub-b.lan").ip_literal is None


# ── resolve_checked ──────────────────────────────────────────────────────────

def test_an_allowed_ip_literal_is_returned_without_resolving():
    assert _run(resolve_checked(parse_address("192.168.1.42:5002"), resolver=_never_resolve)) == ["192.168.1.42"]
    assert _run(resolve_checked(parse_address("[FD00::1]"), resolver=_never_resolve)) == ["fd00::1"]


@pytest.mark.parametrize("text, words", [
    ("8.8.8.8", "a public address"),
    ("169.254.169.254", "link-local"),
    ("127.0.0.1:5002", DEV_ALLOW_LOOPBACK_ENV),
    ("0.0.0.0", "unspecified"),
    ("[ff02::1]", "multicast"),
    ("240.0.0.1", "reserved"),
    ("::ffff:8.8.8.8", "a public address"),
])
def test_a_refused_ip_literal_is_refused_before_anything_is_dialled(text, words):
    with pytest.raises(AddressRefused) as caught:
        _run(resolve_checked(parse_address(text), resolver=_never_resolve))
    assert words in str(caught.value)
    assert "RFC1918" in str(caught.value)


def test_loopback_literal_passes_with_the_development_switch():
    assert _run(resolve_checked(parse_address("127.0.0.1:5002"), allow_loopback=True,
                                resolver=_never_resolve)) == ["127.0.0.1"]


def test_a_hostname_is_resolved_and_every_answer_checked():
    calls: list[str] = []
    resolver = _fake_resolver({"hub-b.lan": ["192.168.1.42", "fd00::42", "192.168.1.42", "fd00::42%eth0"]}, calls)
    assert _run(resolve_checked(parse_address("hub-b.lan:3000"), resolver=resolver)) == ["192.168.1.42", "fd00::42"]
    assert calls == ["hub-b.lan"]


def test_a_hostname_resolving_to_a_public_address_is_refused():
    resolver = _fake_resolver({"evil.example": ["93.184.216.34"]})
    with pytest.raises(AddressRefused) as caught:
        _run(resolve_checked(parse_address("evil.example"), resolver=resolver))
    assert "evil.example resolves to 93.184.216.34" in str(caught.value)
    assert not isinstance(caught.value, AddressUnresolvable)


@pytest.mark.parametrize("answers", [
    ["192.168.1.42", "8.8.8.8"],
    ["8.8.8.8", "192.168.1.42"],
    ["10.0.0.5", "169.254.169.254"],
    ["fd00::1", "127.0.0.1"],
    ["192.168.1.42", "not-an-ip"],
])
def test_a_hostname_resolving_to_a_mix_is_refused(answers):
    resolver = _fake_resolver({"rebind.lan": answers})
    with pytest.raises(AddressRefused):
        _run(resolve_checked(parse_address("rebind.lan"), resolver=resolver))


def test_a_mix_with_loopback_passes_only_with_the_development_switch():
    resolver = _fake_resolver({"dev.lan": ["192.168.1.42", "127.0.0.1"]})
    assert _run(resolve_checked(parse_address("dev.lan"), resolver=resolver, allow_loopback=True)) == \
        ["192.168.1.42", "127.0.0.1"]


def test_a_hostname_resolving_to_nothing_is_refused():
    with pytest.raises(AddressUnresolvable, match="resolves to no address"):
        _run(resolve_checked(parse_address("empty.lan"), resolver=_fake_resolver({"empty.lan": []})))
    with pytest.raises(AddressUnresolvable, match="could not be resolved"):
        _run(resolve_checked(parse_address("missing.lan"), resolver=_fake_resolver({})))


def test_a_resolver_that_hangs_is_refused_after_the_timeout():
    async def hang(host: str) -> list[str]:
        await asyncio.sleep(30)
        return ["192.168.1.42"]

    with pytest.raises(AddressUnresolvable, match="did not resolve within"):
        _run(resolve_checked(parse_address("slow.lan"), resolver=hang, timeout_s=0.05))


def test_the_default_resolver_reads_a_numeric_answer():
    # resolve_checked never hands it an IP literal, and any real name could leave the machine;
    # a numeric host is answered by getaddrinfo itself, with no lookup at all.
    from hubpool_core.peering.addresses import _system_resolver

    assert "127.0.0.1" in _run(_system_resolver("127.0.0.1"))


def test_refusals_happen_before_any_connection():
    """The caller's flow — parse, check, build URLs, probe — with a transport that fails if used."""

    calls: list[str] = []

    async def flow(text: str, answers: dict[str, list[str]]) -> None:
        async with httpx.AsyncClient(transport=_failing_transport(calls)) as http:
            target = parse_address(text)
            ips = await resolve_checked(target, resolver=_fake_resolver(answers))
            for url in candidate_urls(target, ips[0]):
                await probe_identify(http, url)

    for text, answers in [
        ("169.254.169.254", {}),
        ("8.8.8.8:5002", {}),
        ("metadata.lan", {"metadata.lan": ["169.254.169.254"]}),
        ("mixed.lan", {"mixed.lan": ["192.168.1.42", "8.8.4.4"]}),
    ]:
        with pytest.raises(AddressRefused):
            _run(flow(text, answers))
    assert calls == []


# ── candidate_urls ───────────────────────────────────────────────────────────

def test_candidate_urls_try_the_api_port_then_the_dev_port():
    assert DEFAULT_PORTS == (5002, 3000)
    target = parse_address("hub-b.lan")
    assert candidate_urls(target, "192.168.1.42") == ["http://192.168.1.42:5002", "http://192.168.1.42:3000"]


def test_candidate_urls_use_the_named_port_and_the_checked_ip():
    target = parse_address("hub-b.lan:8080")
    assert candidate_urls(target, "fd00::42") == ["http://[fd00::42]:8080"]
    with pytest.raises(ValueError):
        candidate_urls(target, "hub-b.lan")


# ── end to end against a real local server, through the development switch ──

class _IdentifyHandler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's spelling
        if self.path == "/api/inference/pool/identify":
            body = json.dumps({"isCiHub": True, "poolProtocol": 2}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
        else:
            body = b"not found"
            self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_probe_a_hub_on_loopback_with_the_development_switch():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _IdentifyHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]

        async def flow() -> dict:
            target = parse_address(f"127.0.0.1:{port}")
            ips = await resolve_checked(target, allow_loopback=True, resolver=_never_resolve)
            async with httpx.AsyncClient(trust_env=False) as http:
                [url] = candidate_urls(target, ips[0])
                return await probe_identify(http, url, 2.0)

        assert _run(flow()) == {"isCiHub": True, "poolProtocol": 2, "reason": None}
    finally:
        server.shutdown()
        server.server_close()
