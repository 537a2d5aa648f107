"""Signing in to the web UI: the operator key buys an HttpOnly, SameSite=Strict session
cookie; writes also need the page's CSRF token; nothing of the UI answers without it."""

from __future__ import annotations

import re
from contextlib import closing

import httpx
import pytest
from harness import RunningNode
from web.ui_helpers import new_page, sign_in

P = "/api/inference/pool"


@pytest.fixture
def node(tmp_path):
    with RunningNode(tmp_path / "node") as n:
        yield n


def client(node):
    return httpx.Client(base_url=node.url, timeout=15, trust_env=False, follow_redirects=False)


def signed_in(node):
    """A client holding a session, and the CSRF token the page carries."""
    c = client(node)
    r = c.post("/ui/signin", data={"key": node.operator_key})
    assert r.status_code == 303 and r.headers["location"] == "/ui"
    page = c.get("/ui")
    assert page.status_code == 200
    csrf = re.search(r'<meta name="csrf-token" content="([^"]+)">', page.text).group(1)
    return c, csrf, r.headers["set-cookie"]


def test_nothing_of_the_ui_answers_without_a_session(node):
    with client(node) as c:
        for path in ("/ui", "/ui/pool"):
            r = c.get(path)
            assert r.status_code == 303 and r.headers["location"] == "/ui/signin"
        for method, path in (("GET", "/status"), ("GET", "/routing-log/annotated"), ("PATCH", "/settings"),
                             ("POST", "/pairing-pin"), ("GET", "/peers/discoverable/full")):
            r = c.request(method, P + path, json={} if method != "GET" else None)
            assert r.status_code == 401, (path, r.text)
        # a forged cookie is no session
        c.cookies.set("hubpool_session_x", "forged")
        assert c.get(P + "/status", headers={"Cookie": "hubpool_session_0123456789=forged"}).status_code == 401
        # the sign-in page and the static files hold no data and need none
        assert c.get("/ui/signin").status_code == 200
        assert c.get("/ui/static/app.js").status_code == 200


def test_a_wrong_key_or_a_non_operator_key_does_not_sign_in(node):
    with client(node) as c:
        r = c.post("/ui/signin", data={"key": "hpo_not-the-key"})
        assert r.status_code == 401 and "not an operator key" in r.text and "set-cookie" not in r.headers
        r = c.post("/ui/signin", data={})
        assert r.status_code == 401 and "Enter the operator key" in r.text
    key = node.node.keys.create("app", "inference")[1]
    with client(node) as c:
        r = c.post("/ui/signin", data={"key": key})
        assert r.status_code == 401 and "set-cookie" not in r.headers


def test_the_session_cookie_is_httponly_strict_and_writes_need_the_csrf_token(node):
    c, csrf, cookie = signed_in(node)
    with closing(c):
        attrs = [a.strip().lower() for a in cookie.split(";")]
        assert "httponly" in attrs and "samesite=strict" in attrs and "path=/" in attrs
        assert node.operator_key not in cookie
        assert c.get(P + "/status").status_code == 200  # reads need only the cookie
        # a write with the cookie but without the token is refused, and nothing is written
        r = c.patch(P + "/settings", json={"poolLocalAffinity": 7})
        assert r.status_code == 403 and r.json()["code"] == "AUTH_ERROR_CSRF"
        r = c.patch(P + "/settings", json={"poolLocalAffinity": 7}, headers={"X-CSRF-Token": "wrong"})
        assert r.status_code == 403
        assert node.node.settings.current.poolLocalAffinity == 1
        r = c.patch(P + "/settings", json={"poolLocalAffinity": 7}, headers={"X-CSRF-Token": csrf})
        assert r.status_code == 200 and node.node.settings.current.poolLocalAffinity == 7
        # out of range: the node's own 422, through the session as through a key
        r = c.patch(P + "/settings", json={"poolLocalAffinity": 99}, headers={"X-CSRF-Token": csrf})
        assert r.status_code == 422 and "0–20" in r.text
        # sign-out is a write too
        assert c.post("/ui/signout", data={}).status_code == 403
        assert c.get(P + "/status").status_code == 200
        r = c.post("/ui/signout", data={"csrf": csrf})
        assert r.status_code == 303 and "max-age=0" in r.headers["set-cookie"].lower()
    # the old cookie is dead on the node, not just dropped by the browser
    with client(node) as stale:
        name, value = cookie.split(";")[0].split("=", 1)
        assert stale.get(P + "/status", headers={"Cookie": f"{name}={value}"}).status_code == 401
        assert stale.get("/ui", headers={"Cookie": f"{name}={value}"}).status_code == 303


def test_two_nodes_on_one_host_keep_their_own_sessions(tmp_path):
    with RunningNode(tmp_path / "a") as a, RunningNode(tmp_path / "b") as b:
        ca, _, cookie_a = signed_in(a)
        with closing(ca):
            name_a = cookie_a.split("=", 1)[0]
            assert name_a.startswith("hubpool_session_")
            # a browser sends both nodes' cookies to both (cookies ignore the port): b's name differs
            cb, _, cookie_b = signed_in(b)
            with closing(cb):
                assert cookie_b.split("=", 1)[0] != name_a
                both = f"{cookie_a.split(';')[0]}; {cookie_b.split(';')[0]}"
                assert httpx.get(a.url + P + "/status", headers={"Cookie": both}, trust_env=False).status_code == 200
                only_b = cookie_b.split(";")[0]
                assert httpx.get(a.url + P + "/status", headers={"Cookie": only_b}, trust_env=False).status_code == 401


def test_sign_in_and_out_in_a_browser(browser, node):
    page = new_page(browser)
    page.goto(node.url + "/ui/pool")
    page.wait_for_url(node.url + "/ui/signin")  # sent to sign in first
    page.get_by_label("Operator key").fill("hpo_wrong")
    page.get_by_role("button", name="Sign in").click()
    assert "not an operator key" in page.get_by_role("alert").inner_text()
    sign_in(page, node)
    assert page.get_by_role("heading", name="Home").is_visible()
    assert page.evaluate("document.cookie") == ""  # HttpOnly: scripts cannot read the session
    cookies = browser.cookies(node.url)
    assert len(cookies) == 1 and cookies[0]["httpOnly"] and cookies[0]["sameSite"] == "Strict"
    # the page's own write (with its token) works from the browser
    page.goto(node.url + "/ui/pool")
    page.get_by_label("Head start for this node (queued requests)").fill("3")
    page.get_by_role("button", name="Save settings").click()
    page.get_by_text("Saved.").wait_for()
    assert node.node.settings.current.poolLocalAffinity == 3
    # a script on the page without the token is refused, the same as another site would be
    status = page.evaluate("""async () => (await fetch('/api/inference/pool/settings', {method: 'PATCH',
        headers: {'Content-Type': 'application/json'}, body: JSON.stringify({poolLocalAffinity: 5})})).status""")
    assert status == 403 and node.node.settings.current.poolLocalAffinity == 3
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(node.url + "/")
    assert browser.cookies(node.url) == []
    page.goto(node.url + "/ui")
    page.wait_for_url(node.url + "/ui/signin")


def test_sign_in_stops_answering_after_ten_wrong_keys_a_minute(node):
    with client(node) as c:
        for _ in range(10):
            assert c.post("/ui/signin", data={"key": "hpo_guess"}).status_code == 401
        r = c.post("/ui/signin", data={"key": node.operator_key})
        assert r.status_code == 429 and r.headers["retry-after"] == "60" and "set-cookie" not in r.headers
        assert "Too many wrong keys" in r.text


def test_pages_carry_the_security_headers(node):
    c, _, _ = signed_in(node)
    with closing(c), client(node) as anonymous:
        for who, path in ((anonymous, "/"), (anonymous, "/ui/signin"), (c, "/ui"), (c, "/ui/pool")):
            r = who.get(path)
            assert r.status_code == 200, path
            assert "default-src 'self'" in r.headers["content-security-policy"]
            assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
            assert r.headers["x-frame-options"] == "DENY" and r.headers["cache-control"] == "no-store"
            # no inline script: everything the page runs comes from /ui/static
            assert not re.search(r"<script(?![^>]*\bsrc=)(?![^>]*application/json)[^>]*>", r.text), path
