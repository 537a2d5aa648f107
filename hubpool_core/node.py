"""A running node: everything one ``hubpool serve`` process holds, built once at start."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import aiohttp

from hubpool_core.config import EnvSettings, SettingsStore, env_int
from hubpool_core.credentials import KeyStore
from hubpool_core.local_engines import LocalEngines, build_engines
from hubpool_core.plugins import PluginHost, load_plugins
from hubpool_core.proxy.relay import Budgets
from hubpool_core.routing_log import DEFAULT_CAPACITY, MAX_CAPACITY, RoutingLog
from hubpool_core.store import Database

log = logging.getLogger("hubpool.node")


class Node:
    def __init__(self, env: EnvSettings, extra_plugins: Iterable[tuple[str, Any]] = ()):
        self.env = env
        env.data_dir.mkdir(parents=True, exist_ok=True)
        self.settings = SettingsStore(env.data_dir / "settings.json")
        self.db = Database(env.resolved_database_url())
        self.db.migrate()
        self.keys = KeyStore(self.db, env.data_dir, env.operator_key)
        self.plugins: PluginHost = load_plugins(
            env.disabled_plugin_names, self.settings.current.pluginsDisabled, extra_plugins
        )
        self.local = LocalEngines(build_engines(self.plugins.engines, env.environ()))
        size = env_int(env.routing_log_size, minimum=0) or DEFAULT_CAPACITY
        self.routing_log = RoutingLog(max(DEFAULT_CAPACITY, min(MAX_CAPACITY, size)))
        connect = max(15_000, env_int(env.first_byte_timeout_ms, minimum=1) or 300_000)
        self.budgets = Budgets(
            connect_ms=connect,
            completion_ms=max(connect, env_int(env.completion_timeout_ms, minimum=1) or 300_000),
            min_prefill_tps=max(1, env_int(env.min_prefill_tokens_per_sec, minimum=1) or 50),
        )
        self.in_flight = 0
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The process's one upstream session for the relay (created inside the loop)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=15),
                connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
            )
        return self._session

    async def start(self) -> None:
        active = [r.name for r in self.plugins.records if r.active]
        inactive = [f"{r.name} ({r.reason})" for r in self.plugins.records if not r.active]
        log.info("plugins active: %s", ", ".join(active) or "none")
        if inactive:
            log.warning("plugins inactive: %s", "; ".join(inactive))
        for engine in self.local.engines:
            log.info("engine %s at %s (%s)", engine.kind, engine.base_url, engine.config.source)

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
        await self.local.close()
        self.db.dispose()
