"""Browser fixtures: Debian's chromium driven by Playwright for Python (never a downloaded
browser), one headless browser per test session, a fresh profile directory each time."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator

import pytest
from web.ui_helpers import ARGS, CHROMIUM, DESKTOP


@pytest.fixture(scope="module")
def browser_context() -> Iterator:
    """A persistent Chromium context on a fresh, throw-away user-data-dir.

    Module-scoped, not session: Playwright's sync API keeps an asyncio loop running on the main
    thread while it is open, so every later test that calls asyncio.run() would fail."""
    if not CHROMIUM.exists():
        pytest.skip(f"browser tests need Chromium at {CHROMIUM} (Debian: apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:  # pragma: no cover - playwright is a locked dev dependency
        pytest.skip("browser tests need the playwright Python package")
    profile = tempfile.mkdtemp(prefix="hubpool-chromium-")
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(profile, executable_path=str(CHROMIUM), headless=True, args=ARGS,
                                                   viewport=DESKTOP)
        ctx.set_default_timeout(15_000)
        try:
            yield ctx
        finally:
            ctx.close()
            shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def browser(browser_context) -> Iterator:
    """The shared context, emptied of cookies and pages after each test. A script error on any
    page the test opened fails the test."""
    yield browser_context
    errors = [e for page in browser_context.pages for e in getattr(page, "js_errors", [])]
    for page in list(browser_context.pages):
        page.close()
    browser_context.clear_cookies()
    assert not errors, f"JavaScript errors on the page: {errors}"


