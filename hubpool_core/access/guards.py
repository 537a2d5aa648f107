"""Who may call what: the inference guard (origin or inference key) and operator auth.

spec: "What guards what". The inference guard admits a caller from inside by origin —
a private source address, no reverse-proxy provenance header, and no X-Forwarded-For
hop that is not private — and anyone else by an inference API key.
"""

from __future__ import annotations

import functools
import ipaddress
import os
from collections.abc import Mapping

from hubpool_core.access.credentials import KeyStore, Principal

PROVENANCE_HEADERS = ("cf-ray", "cf-connecting-ip", "cf-visitor", "true-client-ip")
TAILNET_V4 = ipaddress.ip_network("100.64.0.0/10")
TAILNET_V6 = ipaddress.ip_network("fd7a:115c:a1e0::/48")
_PRIVATE = [
    ipaddress.ip_network(n)
    for n in ("127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "::1/128", "fc00::/7")
]


def parse_ip(value: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if not value:
        return None
    try:
        addr = ipaddress.ip_address(value.strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped:
        return addr.ipv4_mapped
    return addr


@functools.lru_cache(maxsize=1024)
def is_inside(value: str | None, *, tailnet_inside: bool) -> bool:
    """Whether an address is on this side of the guard. A pure function of its arguments,
    asked on every inference request: cached (parsing an address is most of its cost)."""
    addr = parse_ip(value)
    if addr is None:
        return False
    if addr in TAILNET_V4 or addr in TAILNET_V6:
        return tailnet_inside
    return any(addr in net for net in _PRIVATE)


def tailnet_requires_key() -> bool:
    """HUB_INFERENCE_TAILNET_AUTH=require-key, read per request as the spec says."""
    return os.environ.get("HUB_INFERENCE_TAILNET_AUTH", "").strip().lower() == "require-key"


def admitted_by_origin(client_ip: str | None, headers: dict[str, str]) -> bool:
    tailnet_inside = not tailnet_requires_key()
    if not is_inside(client_ip, tailnet_inside=tailnet_inside):
        return False
    if any(h in headers for h in PROVENANCE_HEADERS):
        return False
    forwarded = headers.get("x-forwarded-for")
    if forwarded:
        return all(is_inside(hop, tailnet_inside=tailnet_inside) for hop in forwarded.split(","))
    return True


def trusts_proxy(raw: str | None) -> bool:
    """HUB_TRUST_PROXY: whether the reverse proxy in front may name the caller (X-Forwarded-For)."""
    return (raw or "").strip().lower() in ("1", "true", "yes")


def source_ip(client_host: str | None, headers: Mapping[str, str], trust_proxy: bool) -> str | None:
    """The caller's IP where it can be honestly told, else None (spec: "What a source means").

    Without proxy trust a request carrying reverse-proxy provenance (or an X-Forwarded-For) came
    through a proxy whose own address is every caller's: keying a limiter on it would be a
    lockout for everyone, not a limit for one. With trust, the last X-Forwarded-For hop is the
    one the proxy itself appended. The PIN cooldown and the web sign-in limiter both use it."""
    if not trust_proxy and (any(h in headers for h in PROVENANCE_HEADERS) or "x-forwarded-for" in headers):
        return None
    if trust_proxy and "x-forwarded-for" in headers:
        # the trusted proxy appends the address it saw: the last hop is the one it vouches for
        return headers["x-forwarded-for"].split(",")[-1].strip() or None
    return client_host


def bearer(headers: dict[str, str]) -> str | None:
    value = headers.get("authorization", "")
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def openai_error(message: str, code: str, type_: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": type_, "code": code}}


def inference_refusal(client_ip: str | None, headers: dict[str, str], keys: KeyStore) -> tuple[int, dict] | None:
    """``None`` when the caller may use the inference routes, else (status, OpenAI-shaped body)."""
    if admitted_by_origin(client_ip, headers):
        return None  # apps inside never pay for a key lookup
    # Anthropic's clients send the key as x-api-key, OpenAI's as a bearer token: either is the key
    token = bearer(headers) or _api_key_header(headers)
    outside = "this caller is outside this node"
    if tailnet_requires_key() and is_inside(client_ip, tailnet_inside=True):
        outside = "tailnet callers need a key here (HUB_INFERENCE_TAILNET_AUTH=require-key)"
    if token is None:
        return 401, openai_error(
            f"An inference API key is required: {outside}. "
            "Create one on the node with `hubpool api-key create --scope inference` "
            "and send it as Authorization: Bearer <key> (or x-api-key: <key>).",
            "missing_api_key",
        )
    principal = keys.resolve(token)
    if principal is None or principal.scope not in ("inference", "operator"):
        return 401, openai_error(
            "Invalid API key: it is not an inference key of this node "
            "(list keys with `hubpool api-key list`).",
            "invalid_api_key",
        )
    return None


def _api_key_header(headers: dict[str, str]) -> str | None:
    value = next((v for k, v in headers.items() if k.lower() == "x-api-key"), None)
    return value.strip() or None if isinstance(value, str) else None


#: Routes a qa:read key may GET (spec: "Reading these without an operator credential").
QA_READ_ROUTES = frozenset({"/api/inference/pool/status", "/api/inference/pool/routing-log",
                            "/api/inference/pool/routing-history", "/metrics"})


def operator_refusal(method: str, path: str, headers: dict[str, str], keys: KeyStore) -> tuple[int, dict] | Principal:
    """The principal for an operator route, or (status, body) refusing it."""
    token = bearer(headers)
    if token is None:
        # the web UI's cookie session stands in for the key (writes also need its CSRF token)
        from hubpool_core.access.sessions import session_refusal

        via_session = session_refusal(method, headers, keys)
        if via_session is not None:
            return via_session
        return 401, {"error": "Operator credential required: send Authorization: Bearer <operator key> "
                     "(the key is in the node's data directory, operator.key; the hubpool CLI sends it for you)",
                     "code": "AUTH_ERROR_MISSING_CREDENTIAL"}
    if keys.is_operator_key(token):
        return Principal("operator", None)
    principal = keys.resolve(token)
    if principal is None:
        return 401, {"error": "Invalid operator credential", "code": "AUTH_ERROR_INVALID_CREDENTIAL"}
    if principal.scope == "operator":
        return principal
    if method not in ("GET", "HEAD"):
        # spec: a read-only key on a write is 401, as if it were no credential at all
        return 401, {"error": "Invalid operator credential for a write", "code": "AUTH_ERROR_INVALID_CREDENTIAL"}
    if principal.scope == "qa:read" and path in QA_READ_ROUTES:
        return principal
    if principal.scope == "qa:read":
        return 403, {"error": "A qa:read key reads only pool status, the routing log and the metrics",
                     "code": "AUTH_ERROR_QA_READ_KEY_ROUTE_NOT_ALLOWED"}
    return 403, {"error": f"A key of scope {principal.scope} cannot use operator routes",
                 "code": "AUTH_ERROR_SCOPE"}
