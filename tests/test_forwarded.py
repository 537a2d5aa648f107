"""Forwarded headers: read by hubpool's own guards, never rewritten by the server first."""

from starlette.requests import Request

from hubpool_core.api.peers import caller_source_ip
from hubpool_core.config import EnvSettings
from hubpool_core.node.server import make_config


def _request(client: str, headers: dict[str, str]) -> Request:
    scope = {"type": "http", "method": "POST", "path": "/", "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
             "client": (client, 5555), "server": ("127.0.0.1", 5002), "scheme": "http", "query_string": b""}
    return Request(scope)


def test_server_does_not_rewrite_client_from_forwarded_headers(tmp_path):
    config = make_config(EnvSettings.from_environ({"HUB_POOL_DATA_DIR": str(tmp_path)}))
    assert config.proxy_headers is False


def test_pin_cooldown_ip_without_proxy_trust():
    assert caller_source_ip(_request("100.64.0.7", {}), trust_proxy=False) == "100.64.0.7"
    # a forwarded request without trust names no IP: keying on the proxy's address would be a global lockout
    assert caller_source_ip(_request("127.0.0.1", {"X-Forwarded-For": "100.64.0.9"}), trust_proxy=False) is None
    assert caller_source_ip(_request("127.0.0.1", {"cf-ray": "abc"}), trust_proxy=False) is None


def test_pin_cooldown_ip_with_proxy_trust_takes_the_proxys_hop():
    request = _request("127.0.0.1", {"X-Forwarded-For": "203.0.113.1, 100.64.0.9"})
    assert caller_source_ip(request, trust_proxy=True) == "100.64.0.9"
    assert caller_source_ip(_request("10.0.0.2", {}), trust_proxy=True) == "10.0.0.2"
