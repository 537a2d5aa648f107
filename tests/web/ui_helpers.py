"""Helpers of the browser tests: where Chromium is, the two widths, screenshots, sign-in."""

from __future__ import annotations

import os
from pathlib import Path

CHROMIUM = Path(os.environ.get("HUBPOOL_TEST_CHROMIUM", "/usr/bin/chromium"))
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
SHOTS = Path(__file__).resolve().parents[2] / "build" / "screenshots"


def new_page(ctx):
    """A page that records console errors, so a script failure fails the test that saw it."""
    page = ctx.new_page()
    page.set_viewport_size(DESKTOP)
    page.js_errors = []
    page.on("pageerror", lambda exc: page.js_errors.append(str(exc)))
    return page


def shoot(page, name: str) -> None:
    """Save the page at desktop (1280x800) and phone (390x844) widths under build/screenshots/:
    the whole page, or just the window while the guide dialog is open."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    size = page.viewport_size
    whole = not page.evaluate("!!document.querySelector('dialog[open]')")
    for label, viewport in (("desktop", DESKTOP), ("phone", PHONE)):
        page.set_viewport_size(viewport)
        page.screenshot(path=str(SHOTS / f"{name}-{label}.png"), full_page=whole, animations="disabled")
    page.set_viewport_size(size or DESKTOP)


def sign_in(page, node) -> None:
    """Sign in on a node's page with its operator key, as an operator does."""
    page.goto(node.url + "/ui/signin")
    page.get_by_label("Operator key").fill(node.operator_key)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(node.url + "/ui")
