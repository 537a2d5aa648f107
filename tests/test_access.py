"""Operator credentials and the inference access guard, through a running node."""

from __future__ import annotations

import os
import stat

import pytest
from harness import RunningNode

from hubpool_core.access.credentials import KeyStore


@pytest.fixture
def node(tmp_path, ollama_sim, vllm_sim, store_url):
    """The shared node fixture, its API keys in SQLite and (with HUBPOOL_TEST_POSTGRES_URL) in PostgreSQL."""
    with RunningNode(tmp_path / "node", {"OLLAMA_URL": ollama_sim.url, "VLLM_URL": vllm_sim.url,
                                         "HUB_POOL_DATABASE_URL": store_url("node")}) as n:
        yield n


def _keys(node) -> KeyStore:
    return node.node.keys


def test_operator_key_file_is_private(node, tmp_path):
    path = node.env.data_dir / "operator.key"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert path.read_text().strip() == node.operator_key


def test_operator_routes_need_the_operator_key(node):
    with node.client() as c:
        for method, path in [("GET", "/api/inference/pool/settings"), ("PATCH", "/api/inference/pool/settings"),
                             ("GET", "/api/inference/pool/status"), ("GET", "/api/inference/pool/routing-log")]:
            r = c.request(method, path, json={})
            assert r.status_code == 401, path
            assert "operator" in r.json()["error"].lower()
            r = c.request(method, path, json={}, headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 401
        assert c.get("/api/inference/pool/status", headers=node.headers()).status_code == 200


def test_env_operator_key_is_accepted(tmp_path):
    with RunningNode(tmp_path / "n", {"HUB_POOL_OPERATOR_KEY": "automation-secret-123"}) as n, n.client() as c:
        assert c.get("/api/inference/pool/settings",
                     headers={"Authorization": "Bearer automation-secret-123"}).status_code == 200
        assert c.get("/api/inference/pool/settings", headers=n.headers()).status_code == 200


def test_qa_read_key_reads_status_and_log_only(node):
    _row, key = _keys(node).create("fleet-qa", "qa:read")
    auth = {"Authorization": f"Bearer {key}"}
    with node.client() as c:
        assert c.get("/api/inference/pool/status", headers=auth).status_code == 200
        assert c.get("/api/inference/pool/routing-log", headers=auth).status_code == 200
        r = c.get("/api/inference/pool/settings", headers=auth)
        assert r.status_code == 403 and r.json()["code"] == "AUTH_ERROR_QA_READ_KEY_ROUTE_NOT_ALLOWED"
        assert c.patch("/api/inference/pool/settings", json={}, headers=auth).status_code == 401


def test_revoked_key_is_refused(node):
    row, key = _keys(node).create("ops", "operator")
    auth = {"Authorization": f"Bearer {key}"}
    with node.client() as c:
        assert c.get("/api/inference/pool/settings", headers=auth).status_code == 200
        _keys(node).revoke(row.id)
        assert c.get("/api/inference/pool/settings", headers=auth).status_code == 401


def test_loopback_app_needs_no_key(node):
    with node.client() as c:
        assert c.get("/v1/models").status_code == 200


def test_provenance_headers_make_a_caller_outside(node):
    """spec: cf-ray and friends, or a public X-Forwarded-For hop, mean the tunnel: a key is needed."""
    _row, key = _keys(node).create("editor", "inference")
    with node.client() as c:
        for headers in ({"cf-ray": "8a1b2c3d4e5f-AMS"}, {"X-Forwarded-For": "203.0.113.10, 172.18.0.2"},
                        {"true-client-ip": "203.0.113.10"}):
            r = c.get("/v1/models", headers=headers)
            assert r.status_code == 401
            assert r.json()["error"]["code"] == "missing_api_key"
            assert "api-key create --scope inference" in r.json()["error"]["message"]
            bad = c.get("/v1/models", headers={**headers, "Authorization": "Bearer nope"})
            assert bad.status_code == 401 and bad.json()["error"]["code"] == "invalid_api_key"
            ok = c.get("/v1/models", headers={**headers, "Authorization": f"Bearer {key}"})
            assert ok.status_code == 200
        # a private forwarded chain is still inside
        assert c.get("/v1/models", headers={"X-Forwarded-For": "172.18.0.5"}).status_code == 200


def test_qa_read_key_is_not_an_inference_key(node):
    _row, key = _keys(node).create("qa", "qa:read")
    with node.client() as c:
        r = c.get("/v1/models", headers={"cf-ray": "x", "Authorization": f"Bearer {key}"})
    assert r.status_code == 401


def test_identify_is_unauthenticated_and_exact(node):
    with node.client() as c:
        r = c.get("/api/inference/pool/identify")
    assert r.status_code == 200 and r.json() == {"isCiHub": True, "poolProtocol": 2}
