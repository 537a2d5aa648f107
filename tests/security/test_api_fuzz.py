"""Issue 9 part 7: schemathesis against the node's own OpenAPI, on running loopback nodes.

The schema is the app's own ``app.openapi()``. FastAPI cannot see the hand-written guards, so
the test declares them on it (operator bearer, signed peer) and gives every write a JSON
object body for schemathesis to generate. Each case is then sent:

- with credentials (operator key; or signed by hub-a through :func:`sign_case`, the auth hook
  that signs each generated case): it must never be a 500 (502-504 are the pool's gateway
  answers: a generated model is on no engine);
- without credentials, and with a wrong one, on every guarded route (the ignored-auth check):
  it must be 401, 403 or 503 (pooling off), never served.

Time-boxed by ``max_examples`` so the module runs in well under a minute.
"""

from __future__ import annotations

import copy
import json
import os

import httpx
import pytest
import schemathesis
from harness import fqdn, make_pool
from hypothesis import HealthCheck, given, settings
from schemathesis.core import NOT_SET

from hubpool_core.node.app import create_app
from hubpool_core.peering.signing import sign_headers
from hubpool_sim import SimConfig, SimModel, run_in_thread

P = "/api/inference/pool"
#: cases per operation: 3 keeps CI under ~15 s; HUBPOOL_API_FUZZ_EXAMPLES=50 is the long run
EXAMPLES = int(os.environ.get("HUBPOOL_API_FUZZ_EXAMPLES", "3"))
# routes that would end the pairing or the identity the rest of the run depends on
DESTRUCTIVE = {("POST", P + "/pair/unpair"), ("POST", P + "/pair/reject"), ("POST", P + "/identity/rotate"),
               ("DELETE", P + "/peers/{peer_id}"), ("POST", P + "/peers/{peer_id}/reject"),
               ("POST", P + "/peers/{peer_id}/disable"), ("PATCH", P + "/settings")}
PEER_ROUTES = (P + "/pair/", P + "/capabilities", P + "/local/")
OPEN_ROUTES = {P + "/identify", P + "/pair/request", P + "/handout", "/metrics"}
OPERATOR_PREFIXES = (P + "/", "/api/inference/preferences")


def guard_of(path: str) -> str | None:
    """Which credential a route needs from a loopback caller: "peer", "operator" or None."""
    if path in OPEN_ROUTES:
        return None
    if path.startswith(PEER_ROUTES):
        return "peer"
    # app-facing under the prefix: both dialects' routes, and rerank's bare spelling (/rerank)
    if path.startswith(OPERATOR_PREFIXES) and not path.startswith((P + "/v1/", P + "/api/")) and path != P + "/rerank":
        return "operator"
    return None  # app-facing: a loopback caller is inside and needs no key


def declared_schema(app_schema: dict) -> dict:
    """The app's OpenAPI with its guards and JSON bodies declared."""
    spec = copy.deepcopy(app_schema)
    spec.setdefault("components", {})["securitySchemes"] = {
        "operator": {"type": "http", "scheme": "bearer"},
        "peer": {"type": "apiKey", "in": "header", "name": "X-Hub-Pool-Signature"},
    }
    for path, ops in list(spec["paths"].items()):
        for method, op in list(ops.items()):
            if (method.upper(), path) in DESTRUCTIVE:
                del ops[method]
                continue
            guard = guard_of(path)
            if guard:
                op["security"] = [{guard: []}]
            if method in ("post", "patch", "put") and "requestBody" not in op:
                op["requestBody"] = {"content": {"application/json": {"schema": {"type": "object"}}}}
        if not ops:
            del spec["paths"][path]
    return spec


@pytest.fixture(scope="module")
def engine():
    cfg = SimConfig(flavor="ollama", models=[SimModel("m", window=4096)])
    with run_in_thread(cfg) as sim:
        yield sim


@pytest.fixture(scope="module")
def pair_ab(tmp_path_factory, engine):
    nodes = make_pool(tmp_path_factory.mktemp("apifuzz"), ["hub-a", "hub-b"],
                      per_node={"hub-b": {"OLLAMA_URL": engine.url}})
    for n in nodes.values():
        n.start()
    a, b = nodes["hub-a"], nodes["hub-b"]
    with b.client(headers=b.headers()) as c:
        pin = c.post(P + "/pairing-pin").json()["pin"]
    with a.client(headers=a.headers()) as c:
        assert c.post(P + "/peers/pair", json={"nodeFqdn": fqdn("hub-b"), "pin": pin}).status_code == 200
    with b.client(headers=b.headers()) as c:
        assert c.post(f"{P}/peers/{fqdn('hub-a')}/approve").status_code == 200
    yield a, b
    for n in nodes.values():
        n.stop()


def _operations(pair_ab):
    _, b = pair_ab
    loaded = schemathesis.openapi.from_dict(declared_schema(create_app(b.node).openapi()))
    return [result.ok() for result in loaded.get_all_operations()]


def sign_case(case, sender, recipient) -> dict[str, str]:
    """The auth hook: hub-a's signature over exactly this generated case."""
    kp = sender.node.identity.get()
    body = None if case.body is NOT_SET else case.body
    return sign_headers(kp, case.method, case.formatted_path, kp.node_uuid, fqdn("hub-a"),
                        recipient.node.identity.get().node_uuid, body)


def _send(case, base_url, headers):
    """The case again, by hand, with exactly ``headers`` as its credentials."""
    body = None if case.body is NOT_SET else case.body
    with httpx.Client(timeout=15, trust_env=False) as client:
        return client.request(case.method, base_url + case.formatted_path, headers=headers,
                              params=case.query or None, json=body)


def check_case(case, a, b) -> None:
    guard = guard_of(case.path)
    if guard == "operator":
        headers = {"Authorization": f"Bearer {b.operator_key}"}
    elif guard == "peer":
        headers = sign_case(case, a, b)
    else:
        headers = {}
    answer = case.call(base_url=b.url, headers=headers)
    # 502/503/504 are the pool's documented gateway answers (a fuzzed model names no engine's
    # model; hub-a runs none); a 500 is an unhandled error, and any refusal must be JSON with a message, not a stack
    assert answer.status_code != 500 and answer.status_code < 505, (case.method, case.formatted_path,
                                                                    answer.status_code, answer.text[:300])
    assert "Traceback" not in answer.text
    if guard is None:
        return
    # ignored auth: the same case with no credential, then with a wrong one, is never served
    wrong = ({"Authorization": "Bearer " + "0" * 43} if guard == "operator"
             else {**headers, "X-Hub-Pool-Signature": "v1.ed25519." + "A" * 86})
    for attempt in ({}, wrong):
        response = _send(case, b.url, attempt)
        assert response.status_code in (401, 403), (case.method, case.path, attempt, response.status_code,
                                                     response.text[:200])
        assert "Traceback" not in response.text
        json.loads(response.text)  # refusals are JSON, never an HTML error page


def test_every_guarded_route_is_declared(pair_ab):
    ops = _operations(pair_ab)
    guarded = {(op.method.upper(), op.path) for op in ops if guard_of(op.path)}
    assert ("GET", P + "/capabilities") in guarded and ("GET", P + "/settings") in guarded
    assert ("POST", P + "/local/v1/chat/completions") in guarded
    assert len(ops) > 50


def test_api_fuzz(pair_ab):
    a, b = pair_ab
    operations = _operations(pair_ab)
    sent: dict[str, int] = {}
    for operation in operations:
        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES == 3, database=None,
                  suppress_health_check=list(HealthCheck))
        def run(case):
            check_case(case, a, b)
            sent[case.operation.label] = sent.get(case.operation.label, 0) + 1

        run()
    assert set(sent) == {op.label for op in operations}  # every operation was exercised
    print(f"schemathesis: {sum(sent.values())} cases over {len(operations)} operations")


def test_a_peer_show_without_a_model_is_a_400(pair_ab):
    """Found by this module: /local/api/show with no model was a 500 (AttributeError)."""
    a, b = pair_ab
    kp = a.node.identity.get()
    for body in ({}, {"model": None}, {"name": 7}):
        headers = sign_headers(kp, "POST", P + "/local/api/show", kp.node_uuid, fqdn("hub-a"),
                               b.node.identity.get().node_uuid, body)
        r = httpx.post(b.url + P + "/local/api/show", headers={**headers, "X-Hub-Pool-Backend": "ollama"}, json=body)
        assert r.status_code == 400 and r.json() == {"error": 'Request body must include a "model" field'}, r.text
