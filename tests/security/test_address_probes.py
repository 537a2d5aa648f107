"""Issue 9 part 6: where an operator-typed address may lead (OWASP SSRF).

A table of probe inputs, each classified exactly: refused on syntax, refused on policy (an IP
literal outside the allowed networks), allowed, or a host name that only the resolver can
judge. A ``sys.addaudithook`` hook watches ``socket.getaddrinfo`` and ``socket.connect`` (plus the
other resolver entry points) and proves that nothing refused on syntax or policy ever reaches
DNS or a socket. Then DNS rebinding and a redirect from /identify against running nodes.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from harness import make_pool

from hubpool_core.peering import addresses
from hubpool_core.peering.addresses import (
    AddressRefused,
    candidate_urls,
    is_allowed_peer_ip,
    parse_address,
    resolve_checked,
)
from hubpool_core.peering.discovery import probe_identify

P = "/api/inference/pool"

# ── The audit hook: installed once (hooks cannot be removed), recording only when asked ──

_WATCHED = {"socket.getaddrinfo", "socket.connect", "socket.gethostbyname", "socket.gethostbyname_ex",
            "socket.gethostbyaddr", "socket.getnameinfo"}
_RECORD: list[tuple[str, tuple]] = []
_ON = threading.Event()


def _hook(event: str, args: tuple) -> None:
    if _ON.is_set() and event in _WATCHED:
        _RECORD.append((event, args))


sys.addaudithook(_hook)


class network_watch:
    """Context manager: every resolver and connect call made (any thread) while inside."""

    def __enter__(self) -> list[tuple[str, tuple]]:
        _RECORD.clear()
        _ON.set()
        return _RECORD

    def __exit__(self, *exc: object) -> None:
        _ON.clear()


def test_the_audit_hook_sees_dns_and_connect():
    # the proof is only as good as the hook: show it catches both kinds of call
    with network_watch() as seen:
        try:
            import socket

            socket.getaddrinfo("127.0.0.1", 9)
            with socket.socket() as s:
                s.settimeout(0.2)
                s.connect_ex(("127.0.0.1", 9))
        except OSError:
            pass
    assert {e for e, _ in seen} >= {"socket.getaddrinfo", "socket.connect"}


# ── The table ────────────────────────────────────────────────────────────────
# class: "syntax" (parse_address refuses), "policy" (an IP literal, refused without DNS),
# "allowed" (an IP literal that may be dialled: expected canonical host and port),
# "name" (a host name: expected canonical host and port; only the resolver can judge it)

SYNTAX, POLICY, ALLOWED, NAME = "syntax", "policy", "allowed", "name"

PROBES: list[tuple[str, str, str | None, int | None]] = [
    # ports
    ("192.168.1.42", ALLOWED, "192.168.1.42", None),
    ("192.168.1.42:5002", ALLOWED, "192.168.1.42", 5002),
    ("192.168.1.42:1", ALLOWED, "192.168.1.42", 1),
    ("192.168.1.42:65535", ALLOWED, "192.168.1.42", 65535),
    ("192.168.1.42:0", SYNTAX, None, None),
    ("192.168.1.42:65536", SYNTAX, None, None),
    ("192.168.1.42:", SYNTAX, None, None),
    (":5002", SYNTAX, None, None),
    ("192.168.1.42:+80", SYNTAX, None, None),
    ("192.168.1.42:-1", SYNTAX, None, None),
    ("192.168.1.42:0x50", SYNTAX, None, None),
    ("192.168.1.42:\u0665\u0660", SYNTAX, None, None),  # Arabic-Indic digits
    ("192.168.1.42:80:80", SYNTAX, None, None),
    ("hub-b.lan:3000", NAME, "hub-b.lan", 3000),
    # IPv6, with and without brackets
    ("fd00::1", ALLOWED, "fd00::1", None),
    ("[fd00::1]", ALLOWED, "fd00::1", None),
    ("[fd00::1]:5002", ALLOWED, "fd00::1", 5002),
    ("[FD00::0001]", ALLOWED, "fd00::1", None),
    ("fd00::1:5002", ALLOWED, "fd00::1:5002", None),  # no brackets: all of it is the address
    ("[fd00::1]5002", SYNTAX, None, None),
    ("[fd00::1", SYNTAX, None, None),
    ("fd00::1]", SYNTAX, None, None),
    ("[192.168.1.42]", SYNTAX, None, None),
    ("[hub-b.lan]", SYNTAX, None, None),
    ("::1", POLICY, None, None),
    ("[::1]:5002", POLICY, None, None),
    ("::", POLICY, None, None),
    ("fe80::1", POLICY, None, None),
    ("fec0::1", POLICY, None, None),
    ("ff02::1", POLICY, None, None),
    ("2001:4860:4860::8888", POLICY, None, None),
    ("fc00::", ALLOWED, "fc00::", None),
    # mapped and embedded IPv4
    ("::ffff:192.168.1.42", ALLOWED, "::ffff:c0a8:12a", None),
    ("[::ffff:10.0.0.1]:80", ALLOWED, "::ffff:a00:1", 80),
    ("::ffff:127.0.0.1", POLICY, None, None),
    ("::ffff:169.254.169.254", POLICY, None, None),
    ("::ffff:8.8.8.8", POLICY, None, None),
    ("::127.0.0.1", POLICY, None, None),  # IPv4-compatible
    ("64:ff9b::7f00:1", POLICY, None, None),  # NAT64 of 127.0.0.1
    ("64:ff9b::a9fe:a9fe", POLICY, None, None),  # NAT64 of the metadata endpoint
    ("2002:7f00:1::", POLICY, None, None),  # 6to4 of 127.0.0.1
    ("2002:c0a8:12a::1", POLICY, None, None),  # 6to4 of a LAN address is still not a LAN address
    # IPv4: the allowed networks at their edges
    ("10.0.0.0", ALLOWED, "10.0.0.0", None),
    ("10.255.255.255", ALLOWED, "10.255.255.255", None),
    ("172.16.0.1", ALLOWED, "172.16.0.1", None),
    ("172.31.255.255", ALLOWED, "172.31.255.255", None),
    ("172.15.255.255", POLICY, None, None),
    ("172.32.0.0", POLICY, None, None),
    ("100.64.0.1", ALLOWED, "100.64.0.1", None),  # tailnet (ipaddress.is_private says no)
    ("100.127.255.255", ALLOWED, "100.127.255.255", None),
    ("100.63.255.255", POLICY, None, None),
    ("100.128.0.0", POLICY, None, None),
    ("169.254.169.254", POLICY, None, None),  # is_private says yes; never probed
    ("127.0.0.1", POLICY, None, None),
    ("127.255.255.254:3000", POLICY, None, None),
    ("0.0.0.0", POLICY, None, None),
    ("224.0.0.251", POLICY, None, None),
    ("255.255.255.255", POLICY, None, None),
    ("192.0.2.1", POLICY, None, None),
    ("198.18.0.1", POLICY, None, None),
    ("8.8.8.8:5002", POLICY, None, None),
    # decimal, octal, hex and shorthand forms the C resolver would read as IPv4
    ("2130706433", SYNTAX, None, None),
    ("0x7f000001", SYNTAX, None, None),
    ("0177.0.0.1", SYNTAX, None, None),
    ("0x7f.1", SYNTAX, None, None),
    ("127.1", SYNTAX, None, None),
    ("10.1", SYNTAX, None, None),
    ("192.168.010.001", SYNTAX, None, None),
    ("1.2.3.4.5", SYNTAX, None, None),
    ("192.168.1.256", SYNTAX, None, None),
    # full-width and other look-alikes
    ("\uff11\uff19\uff12.\uff11\uff16\uff18.\uff11.\uff14\uff12", SYNTAX, None, None),
    ("192\u3002168\u30021\u300242", SYNTAX, None, None),  # ideographic full stops
    ("hub-\u212a.lan", SYNTAX, None, None),  # KELVIN SIGN lower-cases to "k"
    ("\uff48\uff55\uff42.lan", SYNTAX, None, None),
    ("xn--bcher-kva.lan", NAME, "xn--bcher-kva.lan", None),
    # scope ids
    ("fe80::1%eth0", SYNTAX, None, None),
    ("[fe80::1%25eth0]:5002", SYNTAX, None, None),
    ("fd00::1%1", SYNTAX, None, None),
    # userinfo
    ("user@192.168.1.42", SYNTAX, None, None),
    ("user:pass@192.168.1.42:5002", SYNTAX, None, None),
    ("192.168.1.42@127.0.0.1", SYNTAX, None, None),
    ("@hub-b.lan", SYNTAX, None, None),
    # schemes, paths, queries
    ("http://192.168.1.42", SYNTAX, None, None),
    ("HTTPS://hub-b.lan", SYNTAX, None, None),
    ("file:///etc/passwd", SYNTAX, None, None),
    ("gopher://10.0.0.1:70/_", SYNTAX, None, None),
    ("//192.168.1.42", SYNTAX, None, None),
    ("192.168.1.42/api", SYNTAX, None, None),
    ("192.168.1.42\\api", SYNTAX, None, None),
    ("192.168.1.42?x=1", SYNTAX, None, None),
    ("192.168.1.42#frag", SYNTAX, None, None),
    # trailing dots and label shapes
    ("hub-b.lan.", NAME, "hub-b.lan", None),
    ("HUB-B.LAN", NAME, "hub-b.lan", None),
    ("hub-b", NAME, "hub-b", None),
    ("hub-b.lan..", SYNTAX, None, None),
    ("192.168.1.42.", SYNTAX, None, None),
    ("a..b", SYNTAX, None, None),
    (".hub-b.lan", SYNTAX, None, None),
    ("-hub.lan", SYNTAX, None, None),
    ("hub-.lan", SYNTAX, None, None),
    ("hub_b.lan", SYNTAX, None, None),
    ("hub-b.123", SYNTAX, None, None),
    # NUL, control characters, whitespace
    ("192.168.1.42\x00.evil.example", SYNTAX, None, None),
    ("hub-b.lan\x00", SYNTAX, None, None),
    ("hub-b\r\nHost: evil", SYNTAX, None, None),
    ("192.168.1 .42", SYNTAX, None, None),
    ("  192.168.1.42\t", ALLOWED, "192.168.1.42", None),  # surrounding whitespace is trimmed
    ("", SYNTAX, None, None),
    ("   ", SYNTAX, None, None),
    # overlong
    ("a" * 64 + ".lan", SYNTAX, None, None),
    ("a" * 63 + ".lan", NAME, "a" * 63 + ".lan", None),
    (".".join(["a" * 63] * 4), SYNTAX, None, None),  # 255 characters
    ("1" * 301, SYNTAX, None, None),
    ("192.168.1.42:" + "0" * 300, SYNTAX, None, None),
]


def test_the_table_is_large_and_has_no_duplicates():
    assert len(PROBES) >= 60
    assert len({p[0] for p in PROBES}) == len(PROBES)


def _classify(text: str) -> tuple[str, str | None, int | None, str]:
    """Run the probe route's own flow, with a resolver that must not be called for literals."""
    asked: list[str] = []

    async def resolver(host: str) -> list[str]:
        asked.append(host)
        return ["192.168.77.7"]

    try:
        target = parse_address(text)
    except AddressRefused as exc:  # a subclass of ValueError: must not come from parsing
        raise AssertionError(f"parse_address raised AddressRefused for {text!r}") from exc
    except ValueError as exc:
        return SYNTAX, None, None, str(exc)
    try:
        ips = asyncio.run(resolve_checked(target, resolver=resolver))
    except AddressRefused as exc:
        assert not asked, "an IP literal reached the resolver"
        return POLICY, None, None, str(exc)
    if target.ip_literal is None:
        assert asked == [target.host] and ips == ["192.168.77.7"]
        return NAME, target.host, target.port, ""
    assert not asked and ips == [target.host]
    return ALLOWED, target.host, target.port, ""


@pytest.mark.parametrize("text,kind,host,port", PROBES, ids=[repr(p[0])[:40] for p in PROBES])
def test_probe_input_is_classified_exactly(text, kind, host, port):
    with network_watch() as seen:
        got_kind, got_host, got_port, message = _classify(text)
    assert (got_kind, got_host, got_port) == (kind, host, port), message
    assert seen == [], f"{text!r}: {seen}"
    if kind in (SYNTAX, POLICY):
        assert message and "Traceback" not in message
    if kind == POLICY:
        # judged on explicit networks, never ipaddress.is_private
        assert not is_allowed_peer_ip(text.strip().lstrip("[").split("]")[0])


def test_explicit_networks_differ_from_is_private_where_it_matters():
    import ipaddress

    assert not ipaddress.ip_address("100.64.0.1").is_private and is_allowed_peer_ip("100.64.0.1")
    assert ipaddress.ip_address("169.254.169.254").is_private and not is_allowed_peer_ip("169.254.169.254")
    assert ipaddress.ip_address("127.0.0.1").is_private and not is_allowed_peer_ip("127.0.0.1")


@pytest.mark.parametrize("text", [p[0] for p in PROBES if p[1] in (SYNTAX, POLICY)][:200])
def test_nothing_refused_reaches_dns_or_a_socket_through_the_whole_probe_flow(text):
    """The probe route's flow with the SYSTEM resolver and a real HTTP client."""

    async def flow() -> None:
        target = parse_address(text)
        ips = await resolve_checked(target)
        async with httpx.AsyncClient(trust_env=False) as http:
            for url in candidate_urls(target, ips[0]):
                await probe_identify(http, url, 0.5)

    with network_watch() as seen:
        with pytest.raises(ValueError):
            asyncio.run(flow())
    assert seen == []


# ── Against running nodes: rebinding and redirects ───────────────────────────


class _Counting(BaseHTTPRequestHandler):
    hits: list[tuple[str, str, dict]] = []
    redirect_to: str | None = None

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        type(self).hits.append((self.command, self.path, {"body": body.decode("latin-1")}))
        if type(self).redirect_to:
            self.send_response(307)
            self.send_header("Location", type(self).redirect_to + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        out = json.dumps({"isCiHub": True, "poolProtocol": 2, "received": True,
                          "nodeFqdn": "hub-z.example-tailnet.ts.net"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = _answer  # noqa: N815 - http.server's spelling

    def log_message(self, *args: object) -> None:
        pass


def _server(redirect_to: str | None = None):
    handler = type("H", (_Counting,), {"hits": [], "redirect_to": redirect_to})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, handler


def _op(node, path, body):
    with node.client(headers=node.headers()) as c:
        return c.post(P + path, json=body)


@pytest.fixture
def lone_node(tmp_path):
    nodes = make_pool(tmp_path, ["hub-a"])
    node = nodes["hub-a"].start()
    yield node
    node.stop()


def test_a_rebinding_resolver_never_gets_the_pin_to_loopback(lone_node, monkeypatch):
    server, handler = _server()
    answers = [["10.9.8.7"], ["127.0.0.1"], ["127.0.0.1"]]
    asked: list[str] = []

    async def rebinding(host: str) -> list[str]:
        asked.append(host)
        return answers[min(len(asked) - 1, len(answers) - 1)]

    monkeypatch.setattr(addresses, "_system_resolver", rebinding)
    try:
        port = server.server_address[1]
        r = _op(lone_node, "/peers/pair", {"address": f"rebind.lan:{port}", "pin": "123456"})
        assert r.status_code == 400 and "127.0.0.1" in r.json()["error"], r.text
        assert asked == ["rebind.lan", "rebind.lan"]  # checked again right before the credential
        assert handler.hits == []
        assert lone_node.node.peers.all() == []
    finally:
        server.shutdown()
        server.server_close()


def test_a_redirect_from_identify_is_never_followed(tmp_path):
    target, target_handler = _server()
    bouncer, bouncer_handler = _server(redirect_to=f"http://127.0.0.1:{target.server_address[1]}")
    nodes = make_pool(tmp_path, ["hub-a"], environ={"HUB_POOL_DEV_ALLOW_LOOPBACK_PEERS": "true"})
    node = nodes["hub-a"].start()
    try:
        port = bouncer.server_address[1]
        r = _op(node, "/peers/probe", {"address": f"127.0.0.1:{port}"})
        assert r.status_code == 200
        assert r.json() == {"address": f"127.0.0.1:{port}", "isCiHub": False, "poolProtocol": None,
                            "pairable": False, "reason": "not_a_hub"}
        # nor is the pairing request (it carries the PIN) sent on to where a 307 points
        r = _op(node, "/peers/pair", {"address": f"127.0.0.1:{port}", "pin": "123456"})
        assert r.status_code >= 400 and "Traceback" not in r.text
        assert [h[:2] for h in bouncer_handler.hits] == [("GET", P + "/identify"), ("POST", P + "/pair/request")]
        assert target_handler.hits == []
        assert node.node.peers.all() == []
    finally:
        node.stop()
        for s in (target, bouncer):
            s.shutdown()
            s.server_close()
