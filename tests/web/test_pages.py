"""Home cards, the pool page's switches, settings and pins, and the guide's Find and Connect
behaviours with several Hubs, in a real browser against real nodes on loopback."""

from __future__ import annotations

import re
from contextlib import ExitStack

import pytest
from harness import RunningNode, fqdn, make_pool, pair
from web.ui_helpers import new_page, shoot, sign_in

P = "/api/inference/pool"


@pytest.fixture
def three(tmp_path):
    with ExitStack() as stack:
        nodes = make_pool(tmp_path, ["hub-a", "hub-b", "hub-c"])
        for n in nodes.values():
            stack.callback(n.stop)
            n.start()
        yield nodes


def op(node, method, path, body=None):
    with node.client(headers=node.headers()) as c:
        r = c.request(method, P + path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_home_cards_pool_your_hubs_and_the_requests_waiting(browser, three):
    a, b, c = three["hub-a"], three["hub-b"], three["hub-c"]
    page = new_page(browser)
    sign_in(page, a)
    card = page.get_by_role("heading", name="Pool your Hubs")
    card.wait_for()
    shoot(page, "home-pool-your-hubs")
    page.get_by_role("button", name="Dismiss").click()
    assert not card.is_visible()
    page.reload()
    page.get_by_text("Not routing yet").wait_for()
    assert not card.is_visible()  # the browser keeps the dismissal

    op(b, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-a")})
    op(c, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-a")})
    page.reload()
    page.get_by_role("heading", name="2 Hubs want to join your pool").wait_for()
    page.get_by_role("button", name="Review requests").click()
    guide = page.get_by_role("dialog", name="Set up Hub Pool")
    guide.locator('[data-incoming="hub-b.example-tailnet.ts.net"]').wait_for()
    assert guide.locator("[data-incoming]").count() == 2
    # a request sent without a PIN carries no key: the guide says the name is only a claim
    assert "only a claim" in guide.locator("[data-incoming]").first.inner_text()
    assert page.get_by_text("Step 4 of 4 · Approve").count() == 1

    # a fresh node with the card not dismissed, but a request waiting: only the review card
    page2 = new_page(browser)
    sign_in(page2, b)
    page2.get_by_text("Not routing yet").wait_for()
    assert not page2.get_by_role("heading", name="Pool your Hubs").is_visible()


def test_the_pool_page_names_the_switch_and_writes_settings_and_pins(browser, tmp_path):
    with RunningNode(tmp_path / "n", {"HUB_POOL_OUTBOUND_DISABLED": "true"}) as n:
        page = new_page(browser)
        sign_in(page, n)
        page.goto(n.url + "/ui/pool")
        line = page.locator("#routing-line")
        page.get_by_text("HUB_POOL_OUTBOUND_DISABLED=true").wait_for()
        assert "Not routing" in line.inner_text()

        # master off through the settings form, then the page's own fix turns it back on
        page.get_by_label("Hub Pool on", exact=True).uncheck()
        page.get_by_role("button", name="Save settings").click()
        page.get_by_text("the Hub Pool switch (poolEnabled) is off").wait_for()
        assert n.node.settings.current.poolEnabled is False
        page.get_by_role("button", name="Turn on Hub Pool").click()
        page.get_by_text("HUB_POOL_OUTBOUND_DISABLED=true").wait_for()
        assert n.node.settings.current.poolEnabled is True

        # out of range: the node's refusal, with the range, and nothing written
        page.get_by_label("Check on peers every (seconds)").fill("5")
        page.get_by_role("button", name="Save settings").click()
        error = page.locator("#settings-result.error")
        error.wait_for()
        assert "10–300" in error.inner_text() and n.node.settings.current.poolHealthPollSeconds == 30
        page.get_by_label("Check on peers every (seconds)").fill("45")
        page.get_by_label("Context window cap (tokens)").fill("8192")
        page.get_by_role("button", name="Save settings").click()
        page.get_by_text("Saved.").wait_for()
        assert n.node.settings.current.poolHealthPollSeconds == 45 and n.node.settings.current.maxNumCtx == 8192

        # a pin for a model on this node, then removed
        page.get_by_label("Model (empty: every model)").fill("llama3.2:3b")
        page.get_by_role("button", name="Add pin").click()
        page.get_by_text("llama3.2:3b → this node").wait_for()
        assert [p.model for p in n.node.settings.current.poolPins] == ["llama3.2:3b"]
        page.get_by_role("button", name="Remove the pin for llama3.2:3b").click()
        page.get_by_text("No pins.").wait_for()
        assert n.node.settings.current.poolPins == []

        # keyboard: from a fresh load, Tab reaches the skip link first, and focus is drawn
        page.reload()
        page.get_by_role("button", name="Set up Hub Pool").wait_for()
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.textContent") == "Skip to content"
        outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
        assert outline == "solid"
        for _ in range(5):  # hubpool, Home, Hub Pool, Sign out, then the page's Set up button
            page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.textContent") == "Set up Hub Pool"
        page.keyboard.press("Enter")
        page.get_by_role("dialog", name="Set up Hub Pool").wait_for()


def test_find_and_connect_with_several_hubs_and_a_retry(browser, three):
    a, c = three["hub-a"], three["hub-c"]
    c.node.settings.patch({"poolEnabled": False})  # hub-c declines until switched on
    page = new_page(browser)
    sign_in(page, a)
    page.goto(a.url + "/ui/pool")
    page.get_by_role("button", name="Set up Hub Pool").click()
    guide = page.get_by_role("dialog", name="Set up Hub Pool")
    guide.get_by_role("button", name="Continue anyway").click()
    guide.get_by_role("checkbox", name=re.compile("hub-c")).wait_for()
    names = [x.split("\n")[0] for x in guide.locator(".hubcard .hubname").all_inner_texts()]
    assert names == ["hub-b", "hub-c"]  # sorted by name
    guide.get_by_text("Have a PIN?").click()
    guide.get_by_role("button", name="Select all").click()
    assert guide.locator("#guide-send").inner_text() == "Send 2 requests"
    assert guide.get_by_label("PIN from the other Hub").is_disabled()  # a PIN is for exactly one Hub
    shoot(page, "guide-2-find-two")
    guide.get_by_role("button", name="Send 2 requests").click()
    guide.locator('[data-result="hub-c.example-tailnet.ts.net"]').get_by_text("Not sent").wait_for()
    guide.locator('[data-result="hub-b.example-tailnet.ts.net"]').get_by_text("Request sent").wait_for()
    assert guide.get_by_role("button", name="Retry failed requests").is_visible()
    shoot(page, "guide-3-connect-retry")
    c.node.settings.patch({"poolEnabled": True})
    guide.get_by_role("button", name="Retry hub-c").click()
    guide.locator('[data-result="hub-c.example-tailnet.ts.net"]').get_by_text("Request sent").wait_for()
    assert not guide.get_by_role("button", name="Retry failed requests").is_visible()
    guide.get_by_role("button", name="Continue").click()
    guide.locator('[data-waiting="hub-c.example-tailnet.ts.net"]').wait_for()
    assert guide.locator("[data-waiting]").count() == 2


def test_an_empty_scan_lists_the_devices_that_did_not_answer(browser, tmp_path):
    nodes = make_pool(tmp_path, ["hub-a"])
    with nodes["hub-a"] as a:
        page = new_page(browser)
        sign_in(page, a)
        page.goto(a.url + "/ui/pool")
        page.get_by_role("button", name="Set up Hub Pool").click()
        guide = page.get_by_role("dialog", name="Set up Hub Pool")
        guide.get_by_role("button", name="Continue anyway").click()
        guide.get_by_role("heading", name="No Hubs found").wait_for()
        text = guide.inner_text()
        assert "hub-b.example-tailnet.ts.net" in text and "macbook.example-tailnet.ts.net" in text
        assert "Offline" in text  # the macbook, as the tailnet reports it
        shoot(page, "guide-2-find-empty")


def test_the_approve_step_stops_reading_after_ten_minutes(browser, three):
    a = three["hub-a"]
    op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-b")})
    page = new_page(browser)
    page.clock.install()
    sign_in(page, a)
    page.goto(a.url + "/ui/pool")
    page.get_by_role("button", name="Set up Hub Pool").click()
    guide = page.get_by_role("dialog", name="Set up Hub Pool")
    guide.locator("[data-waiting]").wait_for()  # a request waits: it opens on Approve
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    page.clock.fast_forward("00:09")
    page.wait_for_timeout(200)
    assert any(u.endswith(P + "/status") for u in requests)  # reading every 3 s
    assert not any("discoverable" in u for u in requests)  # never rescans
    page.clock.fast_forward("10:00")
    guide.get_by_role("button", name="Check again").wait_for()
    assert "Stopped reading after 10 minutes" in guide.inner_text()
    requests.clear()
    page.clock.fast_forward("00:30")
    page.wait_for_timeout(200)
    assert not any(u.endswith(P + "/status") for u in requests)
    guide.get_by_role("button", name="Check again").click()
    guide.get_by_role("button", name="Check again").wait_for(state="detached")


def test_unpair_from_the_pool_page_after_confirming(browser, three):
    a, b = three["hub-a"], three["hub-b"]
    pair(a, b)
    for n in (a, b):
        n.run(n.node.health.poll_once())
    page = new_page(browser)
    sign_in(page, a)
    page.goto(a.url + "/ui/pool")
    name = fqdn("hub-b")
    row = page.locator(f'#peer-list tr[data-peer="{name}"]')
    row.get_by_text("Connected").wait_for()
    assert "Verified" not in row.inner_text()  # the dashboard shows status words, not the guide's chip
    page.once("dialog", lambda d: d.dismiss())  # changing one's mind keeps the pairing
    page.get_by_role("button", name=f"Unpair {name}").click()
    page.wait_for_timeout(300)
    assert a.node.peers.by_fqdn(fqdn("hub-b")) is not None
    page.once("dialog", lambda d: d.accept())
    page.get_by_role("button", name=f"Unpair {name}").click()
    page.get_by_text("No Hub is paired yet.").wait_for()
    assert a.node.peers.all() == [] and b.node.peers.all() == []  # the other side was told


def test_a_hub_that_needs_you_gets_an_unpair_button_and_an_unreachable_one_does_not(browser, three):
    a, b, c = three["hub-a"], three["hub-b"], three["hub-c"]
    pair(a, b)
    pair(a, c)
    for n in (a, b, c):
        n.run(n.node.health.poll_once())
    b.node.peers.delete(b.node.peers.by_fqdn(fqdn("hub-a")).id)  # hub-b's database was reset
    c.stop()  # hub-c is only down
    a.run(a.node.health.poll_once())
    page = new_page(browser)
    sign_in(page, a)
    page.goto(a.url + "/ui/pool")
    page.get_by_role("button", name="Add Hubs").click()
    guide = page.get_by_role("dialog", name="Set up Hub Pool")
    guide.get_by_role("heading", name="No Hubs found").wait_for()  # Add Hubs opens on the scan
    guide.get_by_role("button", name="Your Hubs").click()
    needs = guide.locator(f'[data-connected="{fqdn("hub-b")}"]')
    needs.get_by_text("refuses this Hub's credentials").wait_for()
    assert needs.get_by_role("button", name="Unpair hub-b").is_visible()
    down = guide.locator(f'[data-connected="{fqdn("hub-c")}"]')
    assert "rejoins by itself" in down.inner_text()
    assert down.get_by_role("button").count() == 0
    shoot(page, "guide-4-needs-you")
    needs.get_by_role("button", name="Unpair hub-b").click()
    needs.wait_for(state="detached")
    assert a.node.peers.by_fqdn(fqdn("hub-b")) is None
    # the dashboard says the same for the Hub that is down: what happened, and no button to press
    guide.get_by_role("button", name="Done").click()
    note = page.locator("#peer-list .note-row")
    note.get_by_text("rejoins by itself").wait_for()
    assert page.get_by_role("button", name=f"Unpair {fqdn('hub-c')}").is_visible()  # unpairing stays possible


def test_the_pin_card_compares_with_the_requesting_hubs_card(browser, tmp_path):
    nodes = make_pool(tmp_path, ["hub-a", "hub-b"])
    with nodes["hub-a"] as a, nodes["hub-b"] as b:
        pin = op(b, "POST", "/pairing-pin")["pin"]
        op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-b"), "pin": pin})
        page = new_page(browser)
        sign_in(page, b)
        page.goto(b.url + "/ui/pool")
        card = page.locator("#pairing-pin")
        text = " ".join(card.inner_text().split())
        # spec "Approve on the other Hub": the request's fingerprint is compared with the requesting Hub's card
        assert "the one the request shows on this Hub" not in text
        assert "compare its fingerprint with the Pairing PIN card of the Hub that sent it" in text
        request = page.locator(f'[data-pending="{fqdn("hub-a")}"]')
        request.get_by_text("compare it with the Pairing PIN card on hub-a").wait_for()
        assert op(a, "GET", "/status")["localNode"]["identity"]["publicKeyFingerprint"] in request.inner_text()


def test_a_hub_that_cannot_sign_says_to_rotate_its_identity(browser, tmp_path):
    nodes = make_pool(tmp_path, ["hub-a", "hub-b"])
    a, b = nodes["hub-a"].start(), nodes["hub-b"].start()
    try:
        pair(a, b)
        for n in (a, b, a):
            n.run(n.node.health.poll_once())
        a.node.identity.secret_path.unlink()  # node.secret lost: the stored key cannot be opened
        a = a.restarted()
        a.run(a.node.health.poll_once())
        page = new_page(browser)
        sign_in(page, a)
        page.goto(a.url + "/ui/pool")
        row = page.locator(f'#peer-list tr[data-peer="{fqdn("hub-b")}"]')
        row.get_by_text("This Hub cannot sign").wait_for()
        note = page.locator("#peer-list .note-row")
        assert "hubpool rotate-identity" in note.inner_text() and "rejoins by itself" not in note.inner_text()
        own = page.get_by_test_id("identity-error")
        assert "This Hub cannot sign" in own.inner_text() and "hubpool rotate-identity" in own.inner_text()
        # the guide says the same, and offers no Unpair button: unpairing one Hub would not help
        page.get_by_role("button", name="Add Hubs").click()
        guide = page.get_by_role("dialog", name="Set up Hub Pool")
        guide.get_by_role("button", name="Your Hubs").click()
        card = guide.locator(f'[data-connected="{fqdn("hub-b")}"]')
        card.get_by_text("hubpool rotate-identity").wait_for()
        assert card.get_by_role("button").count() == 0
    finally:
        a.stop()
        b.stop()


def test_the_pool_page_says_when_the_other_hub_was_not_told(browser, tmp_path):
    nodes = make_pool(tmp_path, ["hub-a", "hub-b"])
    with nodes["hub-a"] as a, nodes["hub-b"] as b:
        op(a, "POST", "/peers/pair", {"nodeFqdn": fqdn("hub-b")})  # no PIN: it cannot be withdrawn there
        page = new_page(browser)
        sign_in(page, a)
        page.goto(a.url + "/ui/pool")
        page.get_by_role("button", name=f"Cancel the request to {fqdn('hub-b')}").click()
        notice = page.locator("#page-notice")
        notice.get_by_text(f"{fqdn('hub-b')} was not told").wait_for()
        assert "stays pending there" in notice.inner_text()
        assert a.node.peers.all() == [] and b.node.peers.by_fqdn(fqdn("hub-a")).status == "pending"


def test_the_settings_page_edits_model_aliases_and_list_settings(browser, tmp_path):
    """Issue 25 item 3: the aliases are edited on the page, one `name = model` a line; a line
    without `=` is refused on the page and nothing is written. The list settings (session
    sources) show one entry a line and survive a save that did not touch them."""
    with RunningNode(tmp_path / "n") as n:
        page = new_page(browser)
        sign_in(page, n)
        page.goto(n.url + "/ui/pool")
        aliases = page.get_by_label("Model aliases (name or pattern = model)")
        aliases.wait_for()
        page.wait_for_function("document.querySelector('[name=poolModelAliases]').value !== ''")
        assert aliases.input_value() == "claude-* = auto"
        sources = page.get_by_label("Where a conversation's id is read from")
        assert sources.input_value().splitlines()[:2] == ["header:X-Hub-Pool-Session",
                                                          "header:X-Claude-Code-Session-Id"]
        aliases.fill("claude-* = auto\ngpt-5-codex")
        page.get_by_role("button", name="Save settings").click()
        error = page.locator("#settings-result.error")
        error.wait_for()
        assert "name = value" in error.inner_text()
        assert n.node.settings.current.poolModelAliases == {"claude-*": "auto"}
        aliases.fill("claude-* = auto\ngpt-5-codex = qwen3:8b")
        page.get_by_role("button", name="Save settings").click()
        page.get_by_text("Saved.").wait_for()
        assert n.node.settings.current.poolModelAliases == {"claude-*": "auto", "gpt-5-codex": "qwen3:8b"}
        assert n.node.settings.current.poolSessionSources[1] == "header:X-Claude-Code-Session-Id"
        shoot(page, "pool-settings-aliases")
