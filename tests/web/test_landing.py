"""The landing page at /: served without a key, holding no data, and building the client
base URLs from the address the browser used (forwarded headers are only displayed)."""

from __future__ import annotations

from contextlib import ExitStack

import httpx
import pytest
from harness import RunningNode, fqdn, make_pool, pair
from web.ui_helpers import new_page, shoot

from hubpool_sim import SimConfig, SimModel, run_in_thread

FORWARDED = {"X-Forwarded-Host": "evil.example:8443", "X-Forwarded-Proto": "https",
             "X-Forwarded-For": "203.0.113.9", "Forwarded": "for=203.0.113.9;host=evil.example;proto=https",
             "X-Forwarded-Prefix": "/<script>alert(1)</script>"}


@pytest.fixture
def busy_pool(tmp_path):
    """hub-a and hub-b paired, each with a simulated engine holding distinctive models."""
    with ExitStack() as stack:
        sa = stack.enter_context(run_in_thread(SimConfig(flavor="ollama", models=[SimModel("secret-model-alpha:7b")])))
        sb = stack.enter_context(run_in_thread(SimConfig(flavor="vllm", models=[SimModel("secret-model-beta:8b")])))
        nodes = make_pool(tmp_path, ["hub-a", "hub-b"], per_node={"hub-a": {"OLLAMA_URL": sa.url},
                                                                    "hub-b": {"VLLM_URL": sb.url}})
        for n in nodes.values():
            stack.callback(n.stop)
            n.start()
        pair(nodes["hub-a"], nodes["hub-b"])
        for n in nodes.values():
            n.run(n.node.health.poll_once())
        yield nodes


def landing(node, headers=None):
    r = httpx.get(node.url + "/", headers=headers or {}, timeout=10, trust_env=False)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    return r


def test_the_landing_page_holds_no_data_whatever_the_headers_say(busy_pool, tmp_path):
    a = busy_pool["hub-a"]
    # the node does hold the data the page must not show
    with a.client(headers=a.headers()) as c:
        status = c.get("/api/inference/pool/status").json()
    assert status["peerCounts"]["connected"] == 1 and status["localNode"]["nodeFqdn"] == fqdn("hub-a")
    # ("Ollama" names a client dialect on the page, so the engine check uses the one it never names)
    secrets = ["secret-model-alpha", "secret-model-beta", "hub-a", "hub-b", "example-tailnet", "vllm",
               status["localNode"]["identity"]["publicKeyFingerprint"], status["localNode"]["identity"]["nodeUuid"]]
    for headers in ({}, FORWARDED, {**FORWARDED, "Host": "pool.example:5002"},
                    {"Host": fqdn("hub-a"), "X-Forwarded-Host": fqdn("hub-b")}):
        page = landing(a, headers).text
        shown = " ".join(headers.values())  # what the caller sent may be echoed back, nothing else
        for word in secrets:
            if word not in shown:
                assert word not in page, (word, headers)
        assert "<script>alert(1)</script>" not in page  # displayed, escaped
    # the strongest form: an empty node renders exactly the same page for the same request
    with RunningNode(tmp_path / "empty") as empty:
        same = {"Host": "pool.example:5002", **{k: v for k, v in FORWARDED.items()}}
        assert landing(empty, same).text == landing(a, same).text


def test_base_urls_come_from_the_address_used_never_from_forwarded_headers(busy_pool):
    a = busy_pool["hub-a"]
    page = landing(a, {**FORWARDED, "Host": "pool.example:5002"}).text
    assert "http://pool.example:5002/v1" in page and "evil.example:8443/v1" not in page
    assert "https://evil.example" not in page
    assert "x-forwarded-host" in page and "evil.example:8443" in page  # shown, as sent
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    plain = landing(a).text
    assert f"{a.url}/v1" in plain and "A proxy forwarded this page" not in plain


def test_the_landing_page_in_a_browser(browser, busy_pool):
    a = busy_pool["hub-a"]
    page = new_page(browser)
    page.goto(a.url + "/")
    assert page.get_by_test_id("openai-url").inner_text() == f"{a.url}/v1"
    assert page.get_by_test_id("ollama-url").inner_text() == a.url
    localhost = a.url.replace("127.0.0.1", "localhost")
    page.goto(localhost + "/")  # another address, another base URL
    assert page.get_by_test_id("openai-url").inner_text() == f"{localhost}/v1"
    page.goto(a.url + "/")
    shoot(page, "landing")
    page.get_by_role("link", name="Sign in").click()
    page.wait_for_url(a.url + "/ui/signin")
