"""Where this node may send a probe or a pairing request when the operator names an address.

``hubpool probe <address>`` and ``hubpool pair <address> --pin <digits>`` (``POST peers/probe``,
``POST peers/pair`` with ``address``) dial something an operator typed, so this module is the
SSRF guard in front of them (spec "Finding a peer by address"):

1. :func:`parse_address` turns the text into a :class:`ProbeTarget` — a host and an optional
   port, nothing else. A scheme, credentials, a path, a query or a fragment is refused.
2. :func:`resolve_checked` answers the IP addresses to dial. An IP literal is checked as it
   stands; a host name is resolved and refused if ANY address it resolves to is not allowed
   (one public answer in a round-robin set is enough to refuse), or if it resolves to none.
3. :func:`candidate_urls` builds ``http://<checked ip>:<port>`` URLs. The caller connects to the
   checked IP, never to the name again, so a second DNS answer cannot differ from the one that
   was checked (DNS rebinding). Keep :attr:`ProbeTarget.host` for a ``Host`` header if needed.

The caller re-runs 2 before the pairing request itself: that is the call that carries a
credential (the PIN) outbound, and the spec requires the check there too.

Allowed (:func:`is_allowed_peer_ip`): RFC1918 (``10.0.0.0/8``, ``172.16.0.0/12``,
``192.168.0.0/16``), CGNAT/tailnet (``100.64.0.0/10``) and IPv6 ULA (``fc00::/7``), and an
IPv4-mapped IPv6 form of an allowed IPv4 address. Everything else is refused: public,
loopback, link-local (``169.254.0.0/16`` holds the cloud metadata endpoint, ``fe80::/10``),
multicast, unspecified, reserved. This is deliberately NOT the "is this private or local"
test an inbound origin check uses, which admits loopback and link-local.

Development switch: ``HUB_POOL_DEV_ALLOW_LOOPBACK_PEERS=true`` (:data:`DEV_ALLOW_LOOPBACK_ENV`)
lets the caller pass ``allow_loopback=True``, which also admits ``127.0.0.0/8`` and ``::1``. It
exists only so several nodes can be tested on one machine, is off by default, and is read by
the caller (this module never reads the environment).
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

__all__ = [
    "ADDRESS_MAX_LENGTH",
    "DEFAULT_PORTS",
    "DEV_ALLOW_LOOPBACK_ENV",
    "AddressRefused",
    "AddressUnresolvable",
    "ProbeTarget",
    "Resolver",
    "candidate_urls",
    "is_allowed_peer_ip",
    "parse_address",
    "resolve_checked",
]

#: Ports tried, in order, when the address names none: the Hub API port, then the dev port
#: (protocol.md §5c). The published port cannot be learned, so a Hub that moved its published
#: port must be named as ``<address>:<port>`` (spec "Finding a peer by address").
DEFAULT_PORTS: tuple[int, ...] = (5002, 3000)

#: ``POST peers/probe`` takes ``{ address: string 1..300 }`` (protocol.md §2a).
ADDRESS_MAX_LENGTH = 300

#: The environment variable the caller reads to pass ``allow_loopback=True``; development only.
DEV_ALLOW_LOOPBACK_ENV = "HUB_POOL_DEV_ALLOW_LOOPBACK_PEERS"

#: Seconds :func:`resolve_checked` waits for a name to resolve before refusing it.
RESOLVE_TIMEOUT_S = 5.0

#: A resolver: an async callable from a host name to the IP address strings it resolves to.
Resolver = Callable[[str], Awaitable[Iterable[str]]]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_ALLOWED_NETWORKS = (
    ipaddress.ip_network("10.0.0.0/8"),
    ipaddress.ip_network("172.16.0.0/12"),
    ipaddress.ip_network("192.168.0.0/16"),
    ipaddress.ip_network("100.64.0.0/10"),  # CGNAT: where tailnet addresses live
    ipaddress.ip_network("fc00::/7"),  # IPv6 ULA
)
_LOOPBACK_NETWORKS = (
    ipaddress.ip_network("127.0.0.0/8"),
    ipaddress.ip_network("::1/128"),
)

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_ALL_DIGITS = re.compile(r"[0-9]+")
_PORT = re.compile(r"[0-9]{1,5}")
_EXAMPLE = "for example 192.168.1.42, 192.168.1.42:5002, [fd00::1]:5002 or hub-b.lan:3000"


class AddressRefused(ValueError):
    """The address may not be dialled. ``str(exc)`` is a sentence for the operator."""


class AddressUnresolvable(AddressRefused):
    """A host name that resolved to no address (or failed to resolve at all).

    A subclass so a caller that wants to answer "unreachable" rather than "refused" for a
    name that does not resolve can tell the two apart; both dial nothing.
    """


@dataclass(frozen=True)
class ProbeTarget:
    """What an operator's address names: a host and an optional port, nothing more.

    ``host`` is lower-case; an IP literal is in its canonical form (``fd00::1``, never
    bracketed), a host name has any one trailing dot removed. ``port`` is ``None`` when the
    address named none, which means "try :data:`DEFAULT_PORTS` in order". ``display`` is the
    canonical text to echo back (``[fd00::1]:5002``, ``hub-b.lan``) — the ``address`` field
    of ``PoolProbeResult``.
    """

    host: str
    port: int | None
    display: str

    @property
    def ip_literal(self) -> IPAddress | None:
        """The host as an IP address when it is an IP literal; ``None`` for a host name."""
        try:
            return ipaddress.ip_address(self.host)
        except ValueError:
            return None

    def host_header(self, port: int) -> str:
        """``Host`` header value naming the target as typed, for a request dialled at ``port``
        on a checked IP (``hub-b.lan:5002``, ``[fd00::1]:3000``)."""
        return f"{_bracketed(self.host)}:{port}"


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def parse_address(value: str) -> ProbeTarget:
    """Parse an operator's address into a :class:`ProbeTarget`, or raise ValueError.

    Accepts an IPv4 literal (``192.168.1.42``), an IPv6 literal bare (``fd00::1``) or in
    brackets (``[fd00::1]``), or a host name (``hub-b.lan``, single-label ``hub-b`` too), each
    optionally followed by ``:<port>`` (1–65535; IPv6 only in brackets). Surrounding
    whitespace is trimmed and the host lower-cased.

    Refuses, with a sentence the operator can act on: an empty value, one longer than
    :data:`ADDRESS_MAX_LENGTH`, a scheme (``http://x``), credentials (``user@x``), a path
    (``x/path``), a query or fragment (``x?y``, ``x#y``), inner whitespace, an IPv6 zone
    index (``fe80::1%eth0``), a bad port, and a name that is neither a valid host name nor
    a dotted-quad IPv4 literal — which includes the shorthand and numeric forms the C
    resolver would silently read as IPv4 (``127.1``, ``2130706433``, ``0x7f000001``), so what
    the operator reads is always what gets checked.

    Parsing does not decide whether the address is allowed: :func:`resolve_checked` does.
    """
    if not isinstance(value, str):
        raise ValueError(f"Give the other Hub's address as text ({_EXAMPLE}).")
    if len(value) > ADDRESS_MAX_LENGTH:
        raise ValueError(
            f"That address is longer than {ADDRESS_MAX_LENGTH} characters; give just the host and, "
            f"if needed, :port ({_EXAMPLE})."
        )
    text = value.strip()
    if not text:
        raise ValueError("Give the other Hub's address: an IP address or host name, optionally with "
                         f":port ({_EXAMPLE}).")
    if _SCHEME.match(text):
        raise ValueError(
            f"Give the address without a scheme ({_EXAMPLE}): the probe chooses http itself and asks "
            "/api/inference/pool/identify on its own."
        )
    if "@" in text:
        raise ValueError("An address cannot carry credentials (user@host); give just the host and, if needed, "
                         f":port ({_EXAMPLE}).")
    if "/" in text or "\\" in text:
        raise ValueError(
            f"Give just the host and, if needed, :port — no path ({_EXAMPLE}); the probe asks "
            "/api/inference/pool/identify on its own."
        )
    if "?" in text or "#" in text:
        raise ValueError("An address cannot carry a query or a fragment; give just the host and, if needed, "
                         f":port ({_EXAMPLE}).")
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
        raise ValueError(f"An address cannot contain spaces or control characters ({_EXAMPLE}).")
    if "%" in text:
        # A zone index only makes sense on link-local IPv6, which is refused anyway; refusing the
        # syntax here keeps "fe80::1%eth0" from reaching the resolver in any form.
        raise ValueError(
            "An IPv6 zone index (%eth0) is not accepted: link-local addresses are never probed. "
            "Use the Hub's LAN (RFC1918), tailnet (100.64.0.0/10) or IPv6 ULA address."
        )

    host, port_text = _split_host_port(text)
    port = _parse_port(port_text, text) if port_text is not None else None

    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if ip is not None:
        host = str(ip)
    else:
        host = _checked_hostname(host)
    display = _bracketed(host) if port is None else f"{_bracketed(host)}:{port}"
    return ProbeTarget(host=host, port=port, display=display)


def _split_host_port(text: str) -> tuple[str, str | None]:
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise ValueError(f"'{text}' opens a bracket it never closes; write an IPv6 address as [fd00::1] or "
                             "[fd00::1]:5002.")
        inner, rest = text[1:close], text[close + 1:]
        try:
            ipaddress.IPv6Address(inner)
        except ValueError:
            raise ValueError(f"'{inner}' in brackets is not an IPv6 address; brackets are only for IPv6 "
                             f"({_EXAMPLE}).") from None
        if not rest:
            return inner, None
        if not rest.startswith(":"):
            raise ValueError(f"After ']' only :port may follow, as in [fd00::1]:5002 (got '{text}').")
        return inner, rest[1:]
    colons = text.count(":")
    if colons == 0:
        return text, None
    if colons == 1:
        host, port_text = text.split(":")
        if not host:
            raise ValueError(f"'{text}' names a port but no host ({_EXAMPLE}).")
        return host, port_text
    # Two or more colons and no brackets: a bare IPv6 literal, which cannot carry a port
    # ("fd00::1:5002" is itself a valid IPv6 address, so a port there would be guessed).
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        raise ValueError(
            f"'{text}' is not an IPv6 address; to give a port with an IPv6 address put the address in "
            "brackets, as in [fd00::1]:5002."
        ) from None
    return text, None


def _parse_port(port_text: str, text: str) -> int:
    if not _PORT.fullmatch(port_text) or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"The port in '{text}' must be a number from 1 to 65535.")
    return int(port_text)


def _checked_hostname(host: str) -> str:
    if not host.isascii():
        # lower() folds some non-ASCII letters into ASCII (KELVIN SIGN -> "k"), so the name
        # dialled would not be the name typed; IDNs must arrive in their xn-- form.
        raise ValueError(f"'{host}' contains non-ASCII characters; write an internationalised name in its "
                         f"xn-- form ({_EXAMPLE}).")
    name = host.lower()
    if name.endswith("."):
        name = name[:-1]
    labels = name.split(".")
    if not name or len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise ValueError(f"'{host}' is neither an IP address nor a valid host name ({_EXAMPLE}).")
    if _ALL_DIGITS.fullmatch(labels[-1]) or _inet_aton_accepts(name):
        # "192.168.1" or "127.1" or "0x7f000001": getaddrinfo would read these as IPv4 in a
        # form the operator did not write; insist on the dotted quad that gets checked.
        raise ValueError(f"'{host}' is not a valid IPv4 address; write it as four dot-separated numbers, "
                         "as in 192.168.1.42.")
    return name


def _inet_aton_accepts(name: str) -> bool:
    try:
        socket.inet_aton(name)
    except OSError:
        return False
    return True


def _as_ip(ip: str | IPAddress) -> IPAddress | None:
    if isinstance(ip, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
        return ip
    if not isinstance(ip, str):
        return None
    text = ip.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _unmapped(ip: IPAddress) -> IPAddress:
    # ::ffff:a.b.c.d reaches the IPv4 host a.b.c.d on a dual-stack socket, so it is judged as
    # that IPv4 address: ::ffff:8.8.8.8 is public, ::ffff:192.168.1.1 is a LAN address.
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def is_allowed_peer_ip(ip: str | IPAddress, *, allow_loopback: bool = False) -> bool:
    """Whether a probe or pairing request may be sent to ``ip`` (spec "Finding a peer by address").

    True only for RFC1918 (``10/8``, ``172.16/12``, ``192.168/16``), CGNAT ``100.64.0.0/10``
    and IPv6 ULA ``fc00::/7`` — and ``127.0.0.0/8`` / ``::1`` when ``allow_loopback`` (the
    development switch, :data:`DEV_ALLOW_LOOPBACK_ENV`). An IPv4-mapped IPv6 address
    (``::ffff:a.b.c.d``) is judged as its IPv4 address. False for everything else: public,
    link-local (``169.254/16``: the cloud metadata endpoint; ``fe80::/10``), multicast,
    unspecified, reserved, and any text that is not an IP address (an IPv6 zone index is
    ignored: the address itself decides). Never raises.
    """
    parsed = _as_ip(ip)
    if parsed is None:
        return False
    parsed = _unmapped(parsed)
    if any(parsed in net for net in _ALLOWED_NETWORKS):
        return True
    return allow_loopback and any(parsed in net for net in _LOOPBACK_NETWORKS)


_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


def _embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address a NAT64, 6to4 or IPv4-compatible IPv6 address carries (refused either
    way; named so the operator sees which host it would have reached)."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip in _NAT64 or (ip in _IPV4_COMPATIBLE and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.sixtofour


def _kind_of(ip: IPAddress) -> str:
    """What an address is, in words, for a refusal sentence."""
    ip = _unmapped(ip)
    embedded = _embedded_ipv4(ip)
    if embedded is not None:
        return f"an IPv6 address embedding the IPv4 address {embedded} ({_kind_of(embedded)})"
    if ip.is_loopback:
        return (
            "loopback (this machine); loopback peers are allowed only with "
            f"{DEV_ALLOW_LOOPBACK_ENV}=true, for testing several nodes on one machine"
        )
    if ip.is_link_local:
        return "link-local (169.254.0.0/16 holds the cloud metadata endpoint), which is never probed"
    if ip.is_unspecified:
        return "the unspecified address"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_global:
        return "a public address"
    return "a reserved or special-purpose address"


_ALLOWED_WORDS = ("an RFC1918 LAN address (10/8, 172.16/12, 192.168/16), a tailnet/CGNAT address (100.64.0.0/10) "
                  "or an IPv6 ULA (fc00::/7)")


async def _system_resolver(host: str) -> list[str]:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


async def resolve_checked(
    target: ProbeTarget,
    *,
    resolver: Resolver | None = None,
    allow_loopback: bool = False,
    timeout_s: float = RESOLVE_TIMEOUT_S,
) -> list[str]:
    """The IP addresses to dial for ``target``, every one of them allowed; else AddressRefused.

    An IP literal is checked as it stands and the resolver is never called. A host name is
    resolved with ``resolver`` (default: the event loop's ``getaddrinfo``), given
    ``timeout_s``, and refused if ANY address it answers is not allowed by
    :func:`is_allowed_peer_ip` — a name is only as safe as its worst answer. A name that
    resolves to nothing, fails to resolve or times out raises :class:`AddressUnresolvable`
    (a subclass of :class:`AddressRefused`). An answer that is not an IP address counts as
    not allowed.

    Returns canonical IP strings (no brackets, no zone index), de-duplicated, in the
    resolver's order. Nothing is dialled here; run this again right before the pairing
    request, and connect to the returned IPs through :func:`candidate_urls`.
    """
    literal = target.ip_literal
    if literal is not None:
        if not is_allowed_peer_ip(literal, allow_loopback=allow_loopback):
            raise AddressRefused(
                f"{target.display} is {_kind_of(literal)}: a Hub is probed or paired with by address only at "
                f"{_ALLOWED_WORDS}."
            )
        return [str(literal)]

    resolve = resolver or _system_resolver
    try:
        answers = list(await asyncio.wait_for(resolve(target.host), timeout_s))
    except TimeoutError:
        raise AddressUnresolvable(f"{target.host} did not resolve within {timeout_s:g} s; check the name, "
                                  "or give the Hub's IP address.") from None
    except (OSError, UnicodeError) as exc:  # socket.gaierror is an OSError
        why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise AddressUnresolvable(f"{target.host} could not be resolved ({why}); check the name, "
                                  "or give the Hub's IP address.") from None

    checked: list[str] = []
    for answer in answers:
        text = answer.split("%", 1)[0] if isinstance(answer, str) else answer
        ip = _as_ip(text)
        if ip is None or not is_allowed_peer_ip(ip, allow_loopback=allow_loopback):
            kind = _kind_of(ip) if ip is not None else "not an IP address"
            raise AddressRefused(
                f"{target.host} resolves to {answer}, which is {kind}; a host name is probed or paired with only "
                f"when every address it resolves to is {_ALLOWED_WORDS}."
            )
        canonical = str(ip)
        if canonical not in checked:
            checked.append(canonical)
    if not checked:
        raise AddressUnresolvable(f"{target.host} resolves to no address; check the name, "
                                  "or give the Hub's IP address.")
    return checked


def candidate_urls(target: ProbeTarget, resolved_ip: str) -> list[str]:
    """Base URLs to try, in order: ``http://<resolved_ip>:<port>`` for the target's port, or
    for each of :data:`DEFAULT_PORTS` (5002, then 3000) when it named none.

    ``resolved_ip`` must be one :func:`resolve_checked` returned: the URL names the checked
    IP, never the host name, so the connection goes exactly where the check looked. IPv6 is
    bracketed. Raises ValueError when ``resolved_ip`` is not an IP address.
    """
    ip = _as_ip(resolved_ip)
    if ip is None:
        raise ValueError(f"{resolved_ip!r} is not an IP address; pass one that resolve_checked returned.")
    ports = (target.port,) if target.port is not None else DEFAULT_PORTS
    return [f"http://{_bracketed(str(ip))}:{port}" for port in ports]
