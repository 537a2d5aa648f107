"""A peer that moves: the relay's connector caches a name's address for 300 s, so a peer whose
address changed was dialled at the dead one for that long. A new connection that fails now drops
the name's cached address (hubpool_core/proxy/connector.py); the network-namespace scenario is
tests/fault/test_n1_partitions.py::test_n1_a_node_whose_address_changes.

Here the "move" is a change of port behind one name, served by real aiohttp servers on loopback
and a resolver that says where the name lives now (the connector's cache is what is tested)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.abc import AbstractResolver

from hubpool_core.proxy.connector import ReuseAwareConnector

NAME = "hub-c.example-tailnet.ts.net"


class MovingResolver(AbstractResolver):
    """Resolves NAME to 127.0.0.1 at ``self.port``; counts lookups."""

    def __init__(self, port: int) -> None:
        self.port, self.lookups = port, 0

    async def resolve(self, host: str, port: int = 0, family: Any = socket.AF_INET) -> list[Any]:
        self.lookups += 1
        return [{"hostname": host, "host": "127.0.0.1", "port": self.port, "family": socket.AF_INET,
                 "proto": 0, "flags": socket.AI_NUMERICHOST}]

    async def close(self) -> None:
        return None


async def _server(text: str) -> tuple[web.AppRunner, int]:
    async def hello(_: web.Request) -> web.Response:
        return web.Response(text=text)

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - the port it bound


async def _moved() -> tuple[list[str], int]:
    old, old_port = await _server("old")
    new, new_port = await _server("new")
    resolver = MovingResolver(old_port)
    connector = ReuseAwareConnector(limit=0, ttl_dns_cache=300, resolver=resolver, force_close=True)
    seen: list[str] = []
    async with aiohttp.ClientSession(connector=connector) as http:
        async def get() -> None:
            try:
                async with http.get(f"http://{NAME}:8080/") as r:
                    seen.append(await r.text())
            except aiohttp.ClientConnectorError:
                seen.append("refused")

        await get()
        await old.cleanup()  # the old address is gone ...
        resolver.port = new_port  # ... and the name now says the new one
        await get()  # dials the cached (dead) address: refused, and forgets it
        await get()
    await new.cleanup()
    return seen, resolver.lookups


def test_a_failed_connect_forgets_the_cached_address_so_a_moved_peer_is_found():
    seen, lookups = asyncio.run(_moved())
    assert seen == ["old", "refused", "new"], seen
    assert lookups == 2, lookups


def test_a_literal_address_has_nothing_to_forget():
    async def go() -> None:
        connector = ReuseAwareConnector(limit=0, ttl_dns_cache=300)
        connector.forget_address("127.0.0.1", 9)  # no error, nothing cached for an address
        connector.forget_address(None, None)
        await connector.close()

    asyncio.run(go())
