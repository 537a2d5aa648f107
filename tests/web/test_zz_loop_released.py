"""Runs after the browser modules (file order): Playwright's sync API must have released the
main thread's event loop, or every later test that calls asyncio.run() fails (the plugin and
simulator suites do)."""

import asyncio


def test_asyncio_run_works_after_the_browser_tests():
    async def ping() -> int:
        return 7

    assert asyncio.run(ping()) == 7
