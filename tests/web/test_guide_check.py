"""The guide's Check step reads doctor's tailnet checks (issue 16 item 15): with a daemon that
says HTTPS certificates are on and `tailscale serve` fronts this node, every check is ready
and the guide skips Check; with HTTPS off for the tailnet, Check stops on it."""

from __future__ import annotations

import json
import re

import pytest
from harness import make_pool
from web.ui_helpers import new_page, sign_in

SERVE = {"TCP": {"443": {"HTTPS": True}},
         "Web": {"hub-a.example-tailnet.ts.net:443": {"Handlers": {"/": {"Proxy": "http://127.0.0.1:{port}"}}}}}


@pytest.fixture
def published(tmp_path, request):
    """hub-a alone, published by `tailscale serve` to its own port; certificates as the test says."""
    node = make_pool(tmp_path, ["hub-a"])["hub-a"]
    status_file = tmp_path / "hub-a-tailscale.json"
    if getattr(request, "param", "on") == "off":
        status = json.loads(status_file.read_text())
        status.pop("CertDomains")
        status_file.write_text(json.dumps(status))
    serve = json.dumps(SERVE).replace("{port}", str(node.port))
    (tmp_path / "hub-a-tailscale.serve.json").write_text(serve)
    with node:
        yield node


def open_guide(page):
    page.get_by_role("button", name=re.compile("Set up Hub Pool|Add Hubs")).click()
    dialog = page.get_by_role("dialog", name="Set up Hub Pool")
    dialog.wait_for()
    return dialog


def test_every_check_ready_skips_check(browser, published):
    page = new_page(browser)
    sign_in(page, published)
    page.goto(published.url + "/ui/pool")
    guide = open_guide(page)
    from playwright.sync_api import expect

    expect(page.locator("#guide-step-label")).to_have_text(re.compile(r"Step 2 of 4 · Find"))  # straight to Find
    assert guide.get_by_text("Tailscale publishes this Hub").count() == 0


@pytest.mark.parametrize("published", ["off"], indirect=True)
def test_https_off_stops_check_with_needs_action(browser, published):
    page = new_page(browser)
    sign_in(page, published)
    page.goto(published.url + "/ui/pool")
    guide = open_guide(page)
    item = guide.locator("li.check", has_text="HTTPS certificates")
    item.wait_for()
    assert item.get_by_text("Needs action").count() == 1
    assert "HTTPS is off" in item.inner_text()
    assert guide.get_by_role("button", name="Continue").is_disabled()
