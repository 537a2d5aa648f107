"""An aiohttp application served on a loopback port from a thread of its own, for tests that
need a small HTTP peer of their own making (an engine that records, a proxy that delays)."""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web


class ThreadedApp:
    """``with ThreadedApp(app) as server:`` serves ``app`` at ``server.url`` until the block ends."""

    def __init__(self, app: web.Application):
        self.app = app
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.runner = web.AppRunner(self.app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # the port the OS chose
        self.ready.set()
        self.loop.run_forever()

    def __enter__(self) -> ThreadedApp:
        self.thread.start()
        assert self.ready.wait(10), "the test server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
