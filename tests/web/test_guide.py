"""The setup guide and the pool page in a real browser, between real nodes on loopback:
Check to "Your pool is ready" with the approval given on the other node's page, a rejected
request, and a failover on the dashboard."""

from __future__ import annotations

import re
from contextlib import ExitStack

import httpx
import pytest
from harness import fqdn, make_pool, pair
from web.ui_helpers import PHONE, new_page, shoot, sign_in

from hubpool_core.peering.peers import public_peer
from hubpool_sim import SimConfig, SimModel, run_in_thread

P = "/api/inference/pool"


@pytest.fixture
def two(tmp_path):
    """hub-a (simulated Ollama: llama3.2:3b) and hub-b (simulated vLLM: llama3.2:3b, qwen3:8b), not paired."""
    with ExitStack() as stack:
        sa = stack.enter_context(run_in_thread(SimConfig(flavor="ollama", models=[SimModel("llama3.2:3b")],
                                                         decode_ms_per_token=0)))
        sb = stack.enter_context(run_in_thread(SimConfig(flavor="vllm", models=[
            SimModel("llama3.2:3b"), SimModel("qwen3:8b")], decode_ms_per_token=0)))
        nodes = make_pool(tmp_path, ["hub-a", "hub-b"], per_node={"hub-a": {"OLLAMA_URL": sa.url},
                                                                    "hub-b": {"VLLM_URL": sb.url}})
        for n in nodes.values():
            stack.callback(n.stop)
            n.start()
        yield nodes, {"hub-a": sa, "hub-b": sb}


def poll(*nodes):
    """One health poll on each node, as its timer would run within poolHealthPollSeconds."""
    for n in nodes:
        n.run(n.node.health.poll_once())


def open_guide(page):
    page.get_by_role("button", name=re.compile("Set up Hub Pool|Add Hubs")).click()
    dialog = page.get_by_role("dialog", name="Set up Hub Pool")
    dialog.wait_for()
    return dialog


def test_the_guide_from_check_to_your_pool_is_ready(browser, two):
    nodes, _ = two
    a, b = nodes["hub-a"], nodes["hub-b"]
    pa, pb = new_page(browser), new_page(browser)
    sign_in(pa, a)
    sign_in(pb, b)

    # hub-b mints a PIN on its pool page, for the operator to type on hub-a
    pb.goto(b.url + "/ui/pool")
    pb.get_by_role("button", name="Generate PIN").click()
    digits = pb.get_by_test_id("pin").inner_text()
    assert re.fullmatch(r"\d{6}", digits)
    # the fingerprint comes with the page's status, which may land after the PIN: wait for it
    b_print = pb.locator("#pin-fingerprint", has_text=re.compile(r"\w")).inner_text()

    pa.bring_to_front()  # a background tab gets no animation frames, which Playwright's clicks wait on
    pa.goto(a.url + "/ui/pool")
    shoot(pa, "pool-page-empty")
    guide = open_guide(pa)

    # 1. Check: a warning (publication cannot be told here) offers Continue anyway
    guide.get_by_text("Tailscale publishes this Hub").wait_for()
    assert guide.get_by_text("Needs action").count() == 0
    shoot(pa, "guide-1-check")
    guide.get_by_role("button", name="Continue anyway").click()

    # 2. Find: a card per Hub, nothing chosen; the PIN field only with exactly one Hub
    card = guide.get_by_role("checkbox", name=re.compile("hub-b"))
    card.wait_for()
    assert not card.is_checked()
    send = guide.locator("#guide-send")
    assert send.inner_text() == "Choose Hubs" and send.is_disabled()
    guide.get_by_text("Have a PIN?").click()
    pin_field = guide.get_by_label("PIN from the other Hub")
    assert pin_field.is_disabled()
    guide.get_by_text("Online").first.wait_for()
    card.check()
    assert send.inner_text() == "Send 1 request" and pin_field.is_enabled()
    pin_field.fill(digits)
    shoot(pa, "guide-2-find")
    # phone: full screen, with the compact step row
    pa.set_viewport_size(PHONE)
    box = guide.bounding_box()
    assert box["width"] == PHONE["width"] and box["height"] == PHONE["height"]
    assert pa.get_by_text("Step 2 of 4 · Find").is_visible()
    pa.set_viewport_size({"width": 1280, "height": 800})
    send.click()

    # 3. Connect: one result per Hub
    guide.get_by_text("Request sent").wait_for()
    shoot(pa, "guide-3-connect")
    guide.get_by_role("button", name="Continue").click()

    # 4. Approve: hub-b waits; closing and reopening lands here again and sends nothing
    guide.locator("[data-waiting]").get_by_text("hub-b").wait_for()
    shoot(pa, "guide-4-approve-waiting")
    guide.get_by_role("button", name="Close the guide").click()
    guide = open_guide(pa)
    guide.locator("[data-waiting]").get_by_text("hub-b").wait_for()
    assert len(b.node.peers.all()) == 1  # one request, not two

    # on hub-b: Home shows the review card; it opens the guide on Approve with the fingerprint
    pb.bring_to_front()
    pb.goto(b.url + "/ui")
    pb.get_by_role("heading", name="1 Hub wants to join your pool").wait_for()
    shoot(pb, "home-review-card")
    pb.get_by_role("button", name="Review request").click()
    other = pb.get_by_role("dialog", name="Set up Hub Pool")
    row = other.locator("[data-incoming]")
    row.wait_for()
    a_print = a.node.identity.get().fingerprint
    assert a_print in row.inner_text() and fqdn("hub-a") in row.inner_text()
    shoot(pb, "guide-4-approve-incoming")
    other.get_by_role("button", name=f"Approve {fqdn('hub-a')}").click()
    other.locator("[data-connected]").wait_for()

    # back on hub-a, within one poll: verified, and the pool is ready
    pa.bring_to_front()
    poll(a, b)
    guide.get_by_role("heading", name="Your pool is ready").wait_for(timeout=10_000)
    assert "qwen3:8b" in guide.locator(".ready").inner_text()
    assert guide.locator("[data-connected]").get_by_text("Verified").is_visible()
    assert public_peer(a.node.peers.by_fqdn(fqdn("hub-b")))["peerKeyFingerprint"] == b_print  # the PIN pinned hub-b's key
    shoot(pa, "guide-4-ready")
    guide.get_by_role("button", name="Done").click()
    assert not guide.is_visible()

    # the pool page now shows the peer and the merged models with their holders
    pa.reload()
    pa.locator("#peer-list tr[data-peer]").get_by_text("Connected").wait_for()
    models = pa.locator("#model-list").inner_text()
    assert "qwen3:8b" in models and "hub-b" in models
    assert "Pooling is routing" in pa.locator("#routing-line").inner_text()
    shoot(pa, "pool-page")


def test_a_rejected_request_is_gone_and_can_be_sent_again(browser, two):
    nodes, _ = two
    a, b = nodes["hub-a"], nodes["hub-b"]
    pa, pb = new_page(browser), new_page(browser)
    sign_in(pa, a)
    sign_in(pb, b)
    pa.bring_to_front()
    pa.goto(a.url + "/ui/pool")
    guide = open_guide(pa)
    guide.get_by_role("button", name="Continue anyway").click()
    guide.get_by_role("checkbox", name=re.compile("hub-b")).check()
    guide.get_by_role("button", name="Send 1 request").click()
    guide.get_by_text("Request sent").wait_for()
    guide.get_by_role("button", name="Continue").click()
    guide.locator("[data-waiting]").wait_for()

    pb.bring_to_front()
    pb.goto(b.url + "/ui/pool")
    pb.get_by_role("button", name=f"Reject {fqdn('hub-a')}").click()
    pb.get_by_text("No requests are waiting.").wait_for()

    pa.bring_to_front()
    guide.get_by_text("The request to hub-b is gone").wait_for(timeout=10_000)
    shoot(pa, "guide-4-gone")
    guide.get_by_role("button", name="Pair again with hub-b").click()
    guide.locator("[data-waiting]").get_by_text("hub-b").wait_for()
    assert guide.get_by_text("The request to hub-b is gone").count() == 0
    assert [r.direction for r in b.node.peers.all()] == ["inbound"]

    # a request cancelled here is not reported as gone
    guide.get_by_role("button", name="Cancel the request to hub-b").click()
    guide.get_by_text("No request of this Hub is waiting.").wait_for()
    assert guide.get_by_text("is gone").count() == 0


def test_the_dashboard_shows_a_request_that_failed_over_with_its_chain(browser, two):
    nodes, sims = two
    a, b = nodes["hub-a"], nodes["hub-b"]
    pair(a, b)
    poll(a, b)
    with a.client(headers=a.headers()) as c:
        r = c.post(P + "/pins", json={"scope": "model", "model": "llama3.2:3b", "targetKind": "peer",
                                       "targetPeerId": a.node.peers.by_fqdn(fqdn("hub-b")).id})
        assert r.status_code == 200
    sims["hub-b"].add_fault("error:503", count=1)
    r = httpx.post(a.url + "/api/chat", json={"model": "llama3.2:3b", "stream": False,
                                              "messages": [{"role": "user", "content": "hello"}]}, timeout=30)
    assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] == "local"
    rid = r.headers["x-hub-pool-request-id"]

    page = new_page(browser)
    sign_in(page, a)
    page.goto(a.url + "/ui/pool")
    row = page.locator(f'[data-request-id="{rid}"]')
    row.wait_for()
    text = row.inner_text()
    assert "Failed over" in text
    assert re.search(r"✗ hub-b\.example-tailnet\.ts\.net \(HTTP 503\)\s*→\s*✓ this node", text), text
    assert f"↳ failed over from {fqdn('hub-b')} (HTTP 503)" in text
    assert "↳ pinned: a model pin put a peer first (prefer)" in text
    # the pin shows in the pins section, with its target named. The status (pins) and the
    # routing log load separately, so the row above can render before the pins do
    page.locator("#pin-list").get_by_text("llama3.2:3b → hub-b.example-tailnet.ts.net").wait_for()
    shoot(page, "pool-page-failover")
