"""This node's own engines: instances, the health snapshot, and the merged listing.

Probes run through :class:`ProbeClient` (httpx's interface, aiohttp's cost for a probe's
GETs). With ``poolProbeSnapshotTtlMs`` at 0, the spec's default, every read probes live;
with a TTL the snapshot is fresh, stale (served while a refresh runs behind the caller) or
cold (the read waits at most the 500 ms placement budget, shared across cold engines).
/capabilities reads the same snapshot with a 20 s TTL and waits a cold probe out: its
poller allows 15 s, and a budget missed there would advertise no engines to every peer
until its next poll.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

import httpx

from hubpool_core.engine import AGENT_DIALECTS, Engine, EngineConfig, ProbeResult
from hubpool_core.models_ids import same_model
from hubpool_core.probe_http import ProbeClient

log = logging.getLogger("hubpool.engines")

PROBE_TIMEOUT_S = 5.0
STALE_GRACE_MS = 60_000
PLACEMENT_BUDGET_MS = 500
#: a read that waits a cold probe out (its own timeout, and a little for the answer to land)
WHOLE_PROBE_MS = int(PROBE_TIMEOUT_S * 1000) + 500
LOCAL_LISTING_DEADLINE_MS = 2_500
#: how long an engine's agent dialects (Engine.agent_dialects) are trusted before they are
#: asked again, behind the probe; an engine seen down is asked afresh when it is back
DIALECTS_REFRESH_S = 300.0


@dataclass
class Snapshot:
    result: ProbeResult
    at: float  # time.monotonic()

    def age_ms(self) -> int:
        return int((time.monotonic() - self.at) * 1000)


@dataclass(frozen=True)
class LocalBackend:
    engine: Engine
    snapshot: Snapshot

    @property
    def healthy(self) -> bool:
        return self.snapshot.result.running and self.snapshot.result.healthy

    def lists(self, model: str) -> bool:
        return any(same_model(m.id, model) for m in self.snapshot.result.models)

    @property
    def dialects(self) -> frozenset[str]:
        """Every dialect this engine answers natively now: its class's, and the agent
        dialects its last probe found (none when unknown)."""
        return self.engine.dialects | (self.snapshot.result.dialects or frozenset())


def build_engines(classes: Sequence[type[Engine]], environ: Mapping[str, str]) -> list[Engine]:
    """One instance per registered engine class, at its environment URL or default.
    ``<NAME>_API_KEY`` beside ``<NAME>_URL`` is the key the engine was started with."""
    engines = []
    for cls in classes:
        url = environ.get(cls.env_var) or cls.default_url
        key_var = cls.env_var.removesuffix("_URL") + "_API_KEY"
        source = cls.env_var if environ.get(cls.env_var) else "default"
        engines.append(cls(EngineConfig(base_url=url, api_key=environ.get(key_var) or None, source=source)))
    return engines


async def _refused(base_url: str) -> bool:
    """Whether a TCP connection to ``base_url``'s host and port is refused (nothing listens).
    Anything else — it connects, times out, the name does not resolve — is ``False``: the
    engine's own probe then says what it is."""
    try:
        parts = urlsplit(base_url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        family = _literal_family(parts.hostname or "")
        if family is not None and _refused_at_once(family, parts.hostname or "", port):
            return True
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            _, writer = await asyncio.open_connection(parts.hostname, port)
        writer.close()
    except ConnectionRefusedError:
        return True
    except (OSError, TimeoutError, ValueError):
        return False
    return False


def _literal_family(host: str) -> socket.AddressFamily | None:
    """The address family of ``host`` when it is an IP address, else ``None`` (a name)."""
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return None


def _refused_at_once(family: socket.AddressFamily, host: str, port: int) -> bool:
    """Whether a non-blocking connect to an address is refused before it returns: on
    loopback (an engine beside the node) the kernel answers the SYN inside the call. This
    runs per request at poolProbeSnapshotTtlMs 0 for every absent engine, at a twentieth of
    open_connection's CPU; ``False`` (not known yet) sends the caller the slow way."""
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setblocking(False)
        code = sock.connect_ex((host, port))
        if code == errno.EINPROGRESS:
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        return code == errno.ECONNREFUSED


class LocalEngines:
    def __init__(self, engines: Sequence[Engine]):
        self.engines = list(engines)
        self._snapshots: dict[int, Snapshot] = {}
        self._inflight: dict[int, asyncio.Task] = {}
        #: index -> (agent dialects found, when): asked once per incarnation, refreshed behind
        self._dialects: dict[int, tuple[frozenset[str], float]] = {}
        self._dialect_refresh: dict[int, asyncio.Task] = {}
        self._http: httpx.AsyncClient | None = None
        #: poolEngineQueueDepth as of the last read: probes then also ask each healthy
        #: engine for its own queue depth (off by default, so nothing extra is requested)
        self.engine_queue_depth = False

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = ProbeClient(timeout=PROBE_TIMEOUT_S)
        return self._http

    async def close(self) -> None:
        for task in [*self._inflight.values(), *self._dialect_refresh.values()]:
            task.cancel()
        if self._http is not None:
            await self._http.aclose()

    async def _probe(self, index: int) -> Snapshot:
        engine = self.engines[index]
        # the first time, the agent dialects are asked beside the probe, not after it: a cold
        # read waits for both within placement's budget. Not for an engine last seen down: at
        # poolProbeSnapshotTtlMs 0 that asked every absent engine's agent routes on every
        # request (three refused connections each, cancelled: 4-5 ms of the read's 16 ms)
        last = self._snapshots.get(index)
        beside = index not in self._dialects and (last is None or last.result.running)
        asking = asyncio.ensure_future(self._ask_dialects(index)) if beside else None
        if last is not None and not last.result.running and await _refused(engine.base_url):
            # refused again: the engine's own probe would say what it said last time, through an
            # HTTP client's whole machinery (0.3-0.4 ms of CPU per absent engine per request at
            # poolProbeSnapshotTtlMs 0); a bare connect says it in a tenth of that
            result = last.result
        else:
            try:
                result = await engine.probe(self.http)
            except Exception as exc:  # noqa: BLE001 - a plugin bug must read as an unhealthy engine
                log.warning("engine %s probe raised %s: %s", engine.kind, type(exc).__name__, exc)
                result = ProbeResult(running=False, healthy=False, error=f"probe failed: {type(exc).__name__}")
        if self.engine_queue_depth and result.healthy:
            try:
                depth = await engine.queue_depth(self.http)
            except Exception as exc:  # noqa: BLE001 - a plugin bug means "no figure", not a sick engine
                log.warning("engine %s queue_depth raised %s: %s", engine.kind, type(exc).__name__, exc)
                depth = None
            if isinstance(depth, int) and not isinstance(depth, bool) and depth >= 0:
                result = replace(result, queue_depth=depth)
        if result.healthy:
            if asking is None and index not in self._dialects:
                # back from down: asked behind this probe, known from the next read on
                self._ask_dialects_behind(index)
            found = await asking if asking is not None else self._known_dialects(index)
            if found is not None:
                result = replace(result, dialects=found)
        else:
            if asking is not None:
                asking.cancel()
            self._dialects.pop(index, None)  # when it is back it may be another build
        snap = Snapshot(result, time.monotonic())
        self._snapshots[index] = snap
        return snap

    def _known_dialects(self, index: int) -> frozenset[str] | None:
        """The engine's agent dialects from the cache, refreshed behind the probe once old."""
        cached = self._dialects.get(index)
        if cached is None:
            return None
        if time.monotonic() - cached[1] > DIALECTS_REFRESH_S:
            self._ask_dialects_behind(index)
        return cached[0]

    def _ask_dialects_behind(self, index: int) -> None:
        task = self._dialect_refresh.get(index)
        if task is None or task.done():
            self._dialect_refresh[index] = asyncio.ensure_future(self._ask_dialects(index))

    async def _ask_dialects(self, index: int) -> frozenset[str] | None:
        engine = self.engines[index]
        try:
            found = await engine.agent_dialects(self.http)
        except Exception as exc:  # noqa: BLE001 - a plugin bug means "not known", not a sick engine
            log.warning("engine %s agent_dialects raised %s: %s", engine.kind, type(exc).__name__, exc)
            found = None
        if found is None:
            return None  # asked again at the next probe
        found = frozenset(d for d in found if d in AGENT_DIALECTS)
        self._dialects[index] = (found, time.monotonic())
        return found

    def _probe_task(self, index: int) -> asyncio.Task:
        task = self._inflight.get(index)
        if task is None or task.done():
            task = asyncio.ensure_future(self._probe(index))
            self._inflight[index] = task
        return task

    def last_snapshot(self, index: int) -> Snapshot | None:
        """The last answer engine ``index`` gave, however old; ``None`` before its first."""
        return self._snapshots.get(index)

    def invalidate(self, engine: Engine) -> None:
        """Drop one engine's snapshot so the next read probes it again."""
        self._snapshots.pop(self.engines.index(engine), None)

    async def read(self, ttl_ms: int, engine_queue_depth: bool | None = None,
                   budget_ms: int = PLACEMENT_BUDGET_MS) -> list[LocalBackend]:
        """Every engine with the answer placement should use now. ``engine_queue_depth``
        (the poolEngineQueueDepth setting, from placement) turns the engines' own queue
        figures on or off for this and later probes; ``None`` leaves it as it was.
        ``budget_ms`` bounds the wait for a cold engine: placement's 500 ms by default."""
        if engine_queue_depth is not None:
            self.engine_queue_depth = engine_queue_depth
        backends = await self._read(ttl_ms, budget_ms)
        return backends if self.engine_queue_depth else self._without_queue_depth(backends)

    @staticmethod
    def _without_queue_depth(backends: list[LocalBackend]) -> list[LocalBackend]:
        # a snapshot probed while the setting was on can outlive it (poolProbeSnapshotTtlMs)
        return [LocalBackend(b.engine, Snapshot(replace(b.snapshot.result, queue_depth=None), b.snapshot.at))
                if b.snapshot.result.queue_depth is not None else b for b in backends]

    async def read_serving(self, ttl_ms: int, kind: str, model: str,
                           budget_ms: int = PLACEMENT_BUDGET_MS) -> list[LocalBackend]:
        """For work a peer already placed here (``/local/*``) on this node's engine ``kind``.

        With a TTL this is :meth:`read`. At ``poolProbeSnapshotTtlMs`` 0 nothing is ranked here
        (the sender chose the engine from what this node advertised), so a live probe would
        only delay the first token: it was a second full probe of every engine on every
        two-hop request. The engines of ``kind`` whose last answer was healthy and listed
        ``model`` within :data:`STALE_GRACE_MS` are used as they are — that answer is kept
        fresh by this node's own requests and by every peer's health poll (capabilities read
        the snapshot at a 20 s TTL) — and with none, the read is :meth:`read`'s."""
        if ttl_ms > 0:
            return await self.read(ttl_ms, budget_ms=budget_ms)
        out = []
        for i, engine in enumerate(self.engines):
            snap = self._snapshots.get(i)
            if engine.kind != kind or snap is None or snap.age_ms() >= STALE_GRACE_MS:
                continue
            backend = LocalBackend(engine, snap)
            if backend.healthy and backend.lists(model):
                out.append(backend)
        if not out:
            return await self.read(ttl_ms, budget_ms=budget_ms)
        return out if self.engine_queue_depth else self._without_queue_depth(out)

    async def _read(self, ttl_ms: int, budget_ms: int) -> list[LocalBackend]:
        if not self.engines:
            return []
        if ttl_ms <= 0:
            snaps = await asyncio.gather(*(self._probe_task(i) for i in range(len(self.engines))))
            return [LocalBackend(e, s) for e, s in zip(self.engines, snaps, strict=True)]
        out: dict[int, Snapshot] = {}
        cold: dict[int, asyncio.Task] = {}
        for i in range(len(self.engines)):
            snap = self._snapshots.get(i)
            age = snap.age_ms() if snap else None
            if snap is not None and age is not None and age < ttl_ms:
                out[i] = snap
            elif snap is not None and age is not None and age < ttl_ms + STALE_GRACE_MS:
                out[i] = snap
                self._probe_task(i)  # refresh behind the caller
            else:
                cold[i] = self._probe_task(i)
        if cold:
            await asyncio.wait(list(cold.values()), timeout=budget_ms / 1000)
            for i, task in cold.items():
                if task.done() and not task.cancelled():
                    out[i] = task.result()
                else:
                    # remembered, so the next request within the TTL does not wait the budget again;
                    # the probe keeps running and its answer replaces this when it lands
                    out[i] = self._snapshots[i] = Snapshot(
                        ProbeResult(running=False, healthy=False,
                                    error=f"no answer within the {budget_ms} ms placement budget; "
                                          "still probing"),
                        time.monotonic(),
                    )
        return [LocalBackend(self.engines[i], out[i]) for i in range(len(self.engines))]

    async def describe_for_502(self, backends: Sequence[LocalBackend], model: str) -> list[dict]:
        """The container's-eye view of every local engine, for the no-candidate 502."""
        rows = []
        for b in backends:
            row = {
                "type": b.engine.kind,
                "url": b.engine.base_url,
                "running": b.snapshot.result.running,
                "healthy": b.snapshot.result.healthy,
                "listsModel": b.lists(model),
                "probedMsAgo": b.snapshot.age_ms(),
            }
            if b.snapshot.result.error:
                row["error"] = b.snapshot.result.error
            rows.append(row)
        return rows


async def listing_backends(local: LocalEngines) -> list[LocalBackend]:
    """Healthy engines for a listing, asked in parallel within LOCAL_LISTING_DEADLINE_MS.

    Only the engines the health snapshot calls healthy (or has no answer for yet) are asked:
    one it calls unhealthy is left out without a wait, and re-probed behind the listing so a
    recovered engine is back in the next one. An engine still silent at the deadline is left
    out when another has answered; when none has, the first to answer is used (spec: What
    the listing endpoints answer for).
    """
    if not local.engines:
        return []
    asked = []
    for i in range(len(local.engines)):
        snap = local._snapshots.get(i)
        if snap is not None and not (snap.result.running and snap.result.healthy):
            local._probe_task(i)  # behind the listing (one probe at a time per engine)
            continue
        asked.append(i)
    if not asked:
        return []
    tasks = {local._probe_task(i): i for i in asked}
    done, pending = await asyncio.wait(list(tasks), timeout=LOCAL_LISTING_DEADLINE_MS / 1000)
    if not done and pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        log.debug("listing left out %s: no answer within %d ms", local.engines[tasks[task]].kind,
                  LOCAL_LISTING_DEADLINE_MS)
    out = []
    for task in done:
        if task.cancelled() or task.exception() is not None:
            continue
        backend = LocalBackend(local.engines[tasks[task]], task.result())
        if backend.healthy:
            out.append(backend)
    out.sort(key=lambda b: local.engines.index(b.engine))
    return out
