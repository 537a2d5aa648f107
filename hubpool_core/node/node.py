"""A running node: everything one ``hubpool serve`` process holds, built once at start."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

import aiohttp

from hubpool_core.access.credentials import KeyStore
from hubpool_core.api.admission import AdmissionQueue
from hubpool_core.config import EnvSettings, SettingsStore, env_int, parse_decimal
from hubpool_core.models_ids import fold_model_id
from hubpool_core.node.directions import Directions, resolve_directions
from hubpool_core.node.heap_trim import HeapTrimmer
from hubpool_core.peering.client import PeerClient
from hubpool_core.peering.health import HealthPoller
from hubpool_core.peering.identity import IdentityStore, node_secret_path
from hubpool_core.peering.nonce_file import load_nonce_cache, nonce_file_path, save_nonce_cache
from hubpool_core.peering.pairing import Pairing
from hubpool_core.peering.pairing_pin import PairingPin, SourceCooldown
from hubpool_core.peering.peers import PeerRepo
from hubpool_core.peering.tailnet import Tailnet, peer_url_overrides
from hubpool_core.placement import TIER_RANK, Load
from hubpool_core.placement.handout import effective_ceiling
from hubpool_core.placement.hops import HopTimes
from hubpool_core.placement.quarantine import Quarantine
from hubpool_core.placement.slot_clock import PeerSlots, SlotClock, engine_clock, stated_ms
from hubpool_core.placement.speed import ResidencyView, SpeedBook
from hubpool_core.placement.throughput import ThroughputStore
from hubpool_core.plugins import PluginHost, load_plugins
from hubpool_core.proxy import Budgets, ReuseAwareConnector
from hubpool_core.proxy.response_homes import ResponseHomes
from hubpool_core.signals.containers import ContainerSampler
from hubpool_core.signals.local_engines import WHOLE_PROBE_MS, LocalEngines, build_engines
from hubpool_core.signals.pressure_sampler import PressureSampler
from hubpool_core.signals.residency import ResidencySampler
from hubpool_core.store import Database
from hubpool_core.store.db import UNREACHABLE, DatabaseUrlError, redacted
from hubpool_core.store.history import DEFAULT_RETENTION_DAYS, HistoryStore
from hubpool_core.telemetry import tracing
from hubpool_core.telemetry.history import DEFAULT_FLUSH_S, HistoryRecorder
from hubpool_core.telemetry.routing_log import DEFAULT_CAPACITY, MAX_CAPACITY, RoutingLog, now_iso

#: a development switch so several nodes can pair by address on one machine; off by default
ALLOW_LOOPBACK_PEERS_VAR = "HUB_POOL_DEV_ALLOW_LOOPBACK_PEERS"

log = logging.getLogger("hubpool.node")


def _instances(classes: Iterable[type], arg: Any, what: str) -> list[Any]:
    """One instance of each registered class; one that fails to start is logged and skipped,
    never fatal to the node."""
    out = []
    for cls in classes:
        try:
            out.append(cls(arg))
        except Exception as exc:  # noqa: BLE001 - a plugin's constructor must not stop the node
            log.warning("%s %s could not start: %s", what, getattr(cls, "name", cls), exc)
    return out


def _retention_days(raw: str | None) -> float:
    """HUB_POOL_HISTORY_RETENTION_DAYS: a positive number of days (fractions allowed); a bad
    value is said in the log and the default kept."""
    if raw is None or not raw.strip():
        return DEFAULT_RETENTION_DAYS
    days = parse_decimal(raw)
    if days is None or not 0 < days <= 36_500:
        log.warning("HUB_POOL_HISTORY_RETENTION_DAYS=%r is not a number of days from 0 to 36500; keeping %d",
                    raw, DEFAULT_RETENTION_DAYS)
        return DEFAULT_RETENTION_DAYS
    return days


class Node:
    def __init__(self, env: EnvSettings, extra_plugins: Iterable[tuple[str, Any]] = ()):
        self.env = env
        env.data_dir.mkdir(parents=True, exist_ok=True)
        self.settings = SettingsStore(env.data_dir / "settings.json")
        self.db = Database(env.resolved_database_url())
        try:
            self.db.migrate()
        except UNREACHABLE as exc:
            # a node whose database is down at start still serves its own engines; the health
            # tick keeps trying, migrates and loads identity and peers once it answers
            self.db.migration_pending = True
            self.db.mark_down(exc)
        self.keys = KeyStore(self.db, env.data_dir, env.operator_key)
        self.plugins: PluginHost = load_plugins(
            env.disabled_plugin_names, self.settings.current.pluginsDisabled, extra_plugins
        )
        self.local = LocalEngines(build_engines(self.plugins.engines, env.environ()))
        #: one instance per engine kind: how a peer's relayed bytes are read (dialect, verdicts)
        self.engine_by_kind = {e.kind: e for e in self.local.engines}
        self.throughput = ThroughputStore()
        #: what predicted time to first token reads: measured speed, load times, residency
        self.speed = SpeedBook()
        self.residency = ResidencyView()
        #: when each local engine's slots free, played forward from the work this node relays to
        #: it; and what each peer last said of its own (placement/slot_clock.py)
        speedup = env_int(env.dev_clock_speedup, minimum=1, maximum=100) or 1
        self.slot_clock = SlotClock(engine_clock(speedup))
        self.peer_slots = PeerSlots(engine_clock(speedup))
        #: each peer's signed round trip, timed on the polls: what a prediction adds for the hop
        self.hops = HopTimes(env_int(env.dev_clock_speedup, minimum=1, maximum=100) or 1)
        self.residency_sampler = ResidencySampler(self.local, self.residency, lambda: self.health.poll_s)
        self.output_quarantine = Quarantine()
        #: which node and engine hold each stored Responses-API answer (previous_response_id)
        self.response_homes = ResponseHomes()
        self.unservable = Quarantine()
        self.stages = _instances(self.plugins.stages, self, "placement stage")
        size = env_int(env.routing_log_size, minimum=0) or DEFAULT_CAPACITY
        self.routing_log = RoutingLog(max(DEFAULT_CAPACITY, min(MAX_CAPACITY, size)))
        #: the routing history (HUB_POOL_HISTORY, docs/history.md): None when off
        self.history: HistoryRecorder | None = None
        self.history_store: HistoryStore | None = None
        #: why HUB_POOL_HISTORY asked for a history the node could not open (None: no such problem)
        self.history_error: str | None = None
        self._open_history(env)
        floor = env_int(env.dev_first_byte_floor_ms, minimum=100, maximum=15_000) or 15_000
        connect = max(floor, env_int(env.first_byte_timeout_ms, minimum=1) or 300_000)
        self.budgets = Budgets(
            connect_ms=connect,
            completion_ms=max(connect, env_int(env.completion_timeout_ms, minimum=1) or 300_000),
            min_prefill_tps=max(1, env_int(env.min_prefill_tokens_per_sec, minimum=1) or 50),
        )
        self.load = Load()
        #: the pool-wide admission queue (poolAdmissionQueue): woken whenever a counted request ends
        self.admission = AdmissionQueue(self)
        self.load.on_release = self.admission.wake
        tier = (env.hardware_tier or "").strip().lower()
        #: the operator's statement of this node's hardware tier (high, medium, low, cpu-only)
        self.hardware_tier = tier if tier in TIER_RANK else None
        self._session: aiohttp.ClientSession | None = None
        # pairing and identity
        self.identity = IdentityStore(self.db, node_secret_path(env.data_dir))
        self.peers = PeerRepo(self.db)
        #: HUB_POOL_DEV_CLOCK_OFFSET_MS: test rigs run nodes whose clocks disagree (0 in production)
        self.clock_offset_ms = env_int(env.dev_clock_offset_ms, minimum=-86_400_000, maximum=86_400_000) or 0
        # What the last process of this node spent survives a restart, so neither a replay
        # reopens nor a peer whose clock lags is locked out (peering/nonce_file.py)
        self.nonce_file = nonce_file_path(env.data_dir)
        self.nonces = load_nonce_cache(self.nonce_file, peers_exist=bool(self.peers.all()),
                                       clock_offset_ms=self.clock_offset_ms)
        save_nonce_cache(self.nonces, self.nonce_file, clean=False)  # a crash from here on is not clean
        self.pairing_pin = PairingPin()
        self.pin_cooldown = SourceCooldown()
        self.directories = _instances(self.plugins.directories, env, "directory")
        self.tailnet = Tailnet(self.directories)
        self.peer_urls = peer_url_overrides(env.peer_urls)
        self.allow_loopback_peers = env.environ().get(ALLOW_LOOPBACK_PEERS_VAR, "").lower() == "true"
        self.peer_client = PeerClient(self)
        self.pairing = Pairing(self)
        self.health = HealthPoller(self)
        self.pressure = PressureSampler(self, _instances(self.plugins.pressure_sources, env, "pressure source"))
        # a registered class is built with this node's environment (its socket path, say); a
        # plain callable is used as it stands
        self.containers = ContainerSampler(
            [s for s in self.plugins.container_stats if not isinstance(s, type)]
            + _instances([s for s in self.plugins.container_stats if isinstance(s, type)], env, "container source"))
        self.heap = HeapTrimmer(lambda: self.routing_log.total_recorded)
        #: OpenTelemetry traces (hubpool_core/telemetry/tracing.py): None unless OTEL_TRACES_EXPORTER asks
        self.tracer: tracing.NodeTracer | None = None

    def _open_history(self, env: EnvSettings) -> None:
        url = env.resolved_history_url()
        if url is None:
            return
        try:
            db = self.db if url == self.db.url else Database(url, setting="HUB_POOL_HISTORY")
        except DatabaseUrlError as exc:  # history is optional: the node runs without it and says why
            log.error("routing history stays off: %s", exc)
            self.history_error = str(exc)
            return
        if db is not self.db:
            try:
                db.migrate()
            except UNREACHABLE as exc:  # written (and migrated) once it answers; the ring is unaffected
                db.migration_pending = True
                db.mark_down(exc)
        days = _retention_days(env.history_retention_days)
        flush_ms = env_int(env.history_flush_ms, minimum=50, maximum=60_000) or int(DEFAULT_FLUSH_S * 1000)
        self.history_store = HistoryStore(db)
        self.history = HistoryRecorder(self.routing_log, self.history_store, flush_s=flush_ms / 1000,
                                       retention_days=days)
        log.info("routing history on: %s, batches every %d ms, kept %g days", redacted(url), flush_ms, days)

    def housekeeping(self) -> None:
        """What rides every health tick besides the probes (sync: it only touches the store)."""
        if not self.db.available or self.db.migration_pending:
            # lost (or never had) the database: one probe a tick; the store work below waits
            # for it, while routing goes on with the peers held in memory
            if not self.db.probe():
                self.pairing_pin.sweep(int(time.time() * 1000))
                self.nonces.sweep()
                return
            self.peers.reload()
            self.identity.retry_now()
        try:
            self._store_housekeeping()
        except UNREACHABLE as exc:
            self.db.mark_down(exc)

    def _store_housekeeping(self) -> None:
        now_ms = int(time.time() * 1000)
        for name in self.peers.expire_pending():
            log.info("pairing request with %s expired after 24 hours", name)
        self.pairing_pin.sweep(now_ms)
        self.nonces.sweep()
        save_nonce_cache(self.nonces, self.nonce_file, clean=False)  # the peers' clock offsets
        for row in self.peers.all():
            seen = self.identity.take_observed_peer_fqdn(row.id)
            if seen and seen != row.node_fqdn:
                if self.peers.by_fqdn(seen) is not None:
                    log.warning("%s now signs as %s, but a row for that name exists; not renaming",
                                row.node_fqdn, seen)
                    continue
                self.peers.update(row.id, node_fqdn=seen)
                log.info("peer %s was renamed to %s (identity beats address)", row.node_fqdn, seen)

    def _advertised(self, backend: Any) -> dict[str, Any]:
        """One engine as peers see it: a model withheld as unservable is not offered."""
        withheld = self.unservable.withheld_models("local", backend.engine.kind)
        models = [m.id for m in backend.snapshot.result.models]
        entry: dict[str, Any] = {"type": backend.engine.kind, "healthy": backend.healthy,
                                 "modelsLoaded": [m for m in models if fold_model_id(m) not in withheld]}
        if backend.snapshot.result.dialects is not None:  # omitted while unknown, as older builds send
            entry["dialects"] = sorted(backend.dialects)
        if withheld:
            entry["unservableModels"] = [m for m in models if fold_model_id(m) in withheld]
        return entry

    def _engine_state(self, backends: list[Any]) -> dict[str, Any]:
        """hubpool's additive capabilities fields for predicted time to first token, each
        omitted when there is nothing to say (absent reads as unknown on the far side, never
        as cold or idle): ``engineSlots`` (what each engine reports it runs at once),
        ``resident`` (the models each engine holds in memory) and ``speed`` (measured
        averages per engine and model) and ``slotsFree`` (when each engine's slots free, ms, once
        the work in flight has had its turn)."""
        out: dict[str, Any] = {}
        slots = [{"backend": b.engine.kind, "slots": b.snapshot.result.slots} for b in backends
                 if b.healthy and b.snapshot.result.slots]
        resident = [{"backend": b.engine.kind, "models": held} for b in backends
                    if b.healthy and (held := self.residency.models("local", b.engine.kind)) is not None]
        speed = self.speed.advertised("local")
        free = [{"backend": b.engine.kind, "ms": stated_ms(ms)} for b in backends
                if b.healthy and b.snapshot.result.slots
                and (ms := self.slot_clock.free_in(b.engine.kind, b.snapshot.result.slots)) is not None]
        for key, value in (("engineSlots", slots), ("resident", resident), ("speed", speed), ("slotsFree", free)):
            if value:
                out[key] = value
        return out

    def directions(self) -> Directions:
        return resolve_directions(self.env, self.settings.current)

    def node_secret(self) -> bytes:
        """The secret that seals this node's private key and peer tokens at rest."""
        return self.identity._node_secret(create=True)  # noqa: SLF001 - one owner of the secret file

    async def capabilities(self, accepting: bool) -> dict[str, Any]:
        """GET /capabilities: the inventory half, emptied when not accepting work."""
        # a cold engine is waited for up to its whole probe, not placement's 500 ms: a poller gives
        # this answer 15 s, and "no engines" would be believed by every peer until its next poll
        backends = await self.local.read(max(self.settings.current.poolProbeSnapshotTtlMs, 20_000),
                                         budget_ms=WHOLE_PROBE_MS)
        payload: dict[str, Any] = {
            "hardwareTier": self.hardware_tier or "unknown",
            "backends": [] if not accepting else [self._advertised(b) for b in backends if b.snapshot.result.running],
            "acceptingWork": accepting,
            "inFlightRequests": self.load.local,
            "updatedAt": now_iso(),
        }
        identity = self.identity.get()
        if identity is not None:
            payload["nodeUuid"] = identity.node_uuid
        payload.update(self.pressure.capabilities_fields())
        throughput = self.throughput.estimates("local")
        if throughput:  # omitted when nothing has been timed, as older builds send
            payload["throughput"] = throughput
        payload.update(self._engine_state(backends if accepting else []))
        ceiling, _ = effective_ceiling(self.env, self.settings.current)
        for key, value in (("maxPromptTokens", ceiling), ("maxNumCtx", self.settings.current.maxNumCtx),
                           ("ollamaSlots", self.settings.current.ollamaSlots)):
            if value is not None:  # omitted when there is none, as older builds send
                payload[key] = value
        containers = self.containers.current()
        if containers is not None and self.settings.current.poolShareContainerStats:
            payload["containers"] = containers  # a health signal: not blanked by acceptingWork
        return payload

    @property
    def session(self) -> aiohttp.ClientSession:
        """The process's one upstream session for the relay (created inside the loop)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=15),
                connector=ReuseAwareConnector(limit=0, ttl_dns_cache=300),
            )
        return self._session

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        active = [r.name for r in self.plugins.records if r.active]
        inactive = [f"{r.name} ({r.reason})" for r in self.plugins.records if not r.active]
        log.info("plugins active: %s", ", ".join(active) or "none")
        if inactive:
            log.warning("plugins inactive: %s", "; ".join(inactive))
        for engine in self.local.engines:
            log.info("engine %s at %s (%s)", engine.kind, engine.base_url, engine.config.source)
        self.health.start()
        self.residency_sampler.start()
        self.pressure.start()
        self.containers.start()
        self.heap.start()
        if self.history is not None:
            self.history.start()
        self.tracer = await tracing.for_node(self)

    async def stop(self) -> None:
        await self.health.stop()
        await self.residency_sampler.stop()
        # the server has stopped admitting requests: what was spent is complete
        await asyncio.to_thread(save_nonce_cache, self.nonces, self.nonce_file, clean=True)
        await self.pressure.stop()
        await self.containers.stop()
        await self.heap.stop()
        await self.peer_client.close()
        if self._session is not None:
            await self._session.close()
        await self.local.close()
        if self.tracer is not None:  # flushes the spans still batched
            await self.tracer.shutdown()
        if self.history is not None:  # what settled since the last batch
            await self.history.stop()
            if self.history_store is not None and self.history_store.db is not self.db:
                self.history_store.db.dispose()
        self.db.dispose()
