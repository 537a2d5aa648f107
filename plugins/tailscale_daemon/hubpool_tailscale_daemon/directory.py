"""The local Tailscale daemon as a directory and as this node's tailnet status.

``HUB_POOL_TAILSCALE_CLI`` (``env.tailscale_cli``, default ``tailscale``) is a command
line split with :mod:`shlex`. When its last word is a path ending in ``.json`` that file
is read as a recorded ``tailscale status --json`` answer (``cat /path/status.json`` and a
bare ``/path/status.json`` both work); otherwise ``<command> status --json`` is run.

Where the daemon can say more, it is asked: ``<command> serve status --json`` says what
``tailscale serve`` publishes (for a recorded file, a ``<name>.serve.json`` beside it is that
answer, and its absence reads as "cannot tell"). From the two answers the node learns its
name, the tailnet's suffix and name, whether the tailnet issues it an HTTPS certificate
(``CertDomains``), whether the coordination server sees it online (``Self.Online``), the
daemon's backend state, and whether ``https://<name>`` is served by this node's port.

The parsed answer is cached for 30 s, failures included, so the status page can poll
without forking a process per poll. Nothing here raises: a missing binary, a daemon
that is not running, a hung command or garbage output each become
``TailnetStatus(connected=False, error=<sentence>)`` and an empty candidate list.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import shlex
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hubpool_core import Directory, DirectoryCandidate, TailnetStatus

log = logging.getLogger(__name__)

DEFAULT_CLI = "tailscale"
CACHE_SECONDS = 30.0
TIMEOUT_SECONDS = 5.0
MISSING_SENTENCE = "tailscale is not installed here (set HUB_POOL_TAILSCALE_CLI to its path)"
_STDERR_CHARS = 200


@dataclass(frozen=True)
class _Invocation:
    """How to get a status answer: read ``json_path``, or run ``argv``."""

    argv: tuple[str, ...] = ()
    json_path: Path | None = None
    #: how to ask `tailscale serve status --json`: run this, or read ``serve_path``
    serve_argv: tuple[str, ...] = ()
    serve_path: Path | None = None


@dataclass(frozen=True)
class _Reading:
    """One status read: the parsed answer, or the sentence saying why there is none."""

    status: dict[str, Any] | None
    error: str | None
    #: the `tailscale serve status --json` answer; None when it could not be read
    serve: dict[str, Any] | None = None
    #: the TailnetStatus parsed from ``status``, made on first ask: every signed peer forward
    #: asks for this node's name, and a parse per forward showed in its profile
    parsed: list[TailnetStatus] = field(default_factory=list, compare=False, repr=False)


def normalise_fqdn(name: str) -> str:
    """``Hub-B.Example-Tailnet.ts.net.`` -> ``hub-b.example-tailnet.ts.net``."""
    return name.strip().rstrip(".").lower()


@functools.lru_cache(maxsize=8)
def _invocation(cli: str) -> _Invocation | None:
    """Parse the configured command; ``None`` when it is empty or unparseable. Cached: it is
    a pure function of the setting, and signing every peer forward reached it via shlex."""
    try:
        words = shlex.split(cli)
    except ValueError:
        return None
    if not words:
        return None
    if words[-1].lower().endswith(".json"):
        path = Path(words[-1]).expanduser()
        return _Invocation(json_path=path, serve_path=path.with_name(path.name[: -len(".json")] + ".serve.json"))
    return _Invocation(argv=(*words, "status", "--json"), serve_argv=(*words, "serve", "status", "--json"))


def _resolvable(inv: _Invocation | None) -> bool:
    if inv is None:
        return False
    if inv.json_path is not None:
        return inv.json_path.is_file()
    return shutil.which(inv.argv[0]) is not None


_STATE_SENTENCES = {
    "Stopped": "Tailscale is stopped on this machine (backend state Stopped): run `tailscale up`",
    "NeedsLogin": "Tailscale needs a login on this machine (backend state NeedsLogin): run `tailscale up` and log in",
    "NeedsMachineAuth": "this machine waits for an admin to approve it in the Tailscale admin console "
                        "(backend state NeedsMachineAuth)",
    "Starting": "Tailscale is still starting on this machine (backend state Starting); check again in a moment",
    "NoState": "tailscaled has no state yet (backend state NoState): run `tailscale up`",
}


def _serving(serve: dict[str, Any] | None, self_fqdn: str, port: int | None) -> tuple[bool | None, str | None]:
    """Whether `tailscale serve` publishes https://<self_fqdn> to this node's port, from its
    ``serve status --json`` answer (``{"Web": {"<name>:443": {"Handlers": {"/": {"Proxy":
    "http://127.0.0.1:5002"}}}}}``); ``None`` when that answer could not be read."""
    if serve is None:
        return None, None
    web = serve.get("Web")
    site = web.get(f"{self_fqdn}:443") if isinstance(web, dict) else None
    if site is None and isinstance(web, dict):  # the daemon may spell the name with other case
        site = next((v for k, v in web.items() if isinstance(k, str) and k.lower() == f"{self_fqdn}:443"), None)
    handlers = site.get("Handlers") if isinstance(site, dict) else None
    root = handlers.get("/") if isinstance(handlers, dict) else None
    proxy = root.get("Proxy") if isinstance(root, dict) else None
    if not isinstance(proxy, str) or not proxy:
        return False, f"`tailscale serve` publishes nothing at https://{self_fqdn}/"
    if port is None:
        return True, None
    target = proxy.rsplit(":", 1)[-1].split("/", 1)[0] if "://" in proxy or ":" in proxy else proxy
    if target.isdigit() and int(target) == port:
        return True, None
    return False, f"https://{self_fqdn}/ is served by {proxy}, not by this node (port {port})"


def _first_line(data: bytes) -> str:
    text = data.decode("utf-8", "replace").strip()
    line = text.splitlines()[0].strip() if text else ""
    return line[:_STDERR_CHARS]


class TailscaleDaemonDirectory(Directory):
    """Every peer in the local daemon's peer map, plus this node's tailnet status.

    Reads ``env.tailscale_cli``. ``configured()`` is whether that command (or recorded
    ``.json`` file) exists here; when it does not, nothing is spawned.
    """

    name = "tailscale_daemon"
    is_tailnet = True

    def __init__(
        self,
        env: Any,
        *,
        clock: Callable[[], float] = time.monotonic,
        cache_seconds: float = CACHE_SECONDS,
        timeout: float = TIMEOUT_SECONDS,
    ) -> None:
        super().__init__(env)
        self._clock = clock
        self._cache_seconds = cache_seconds
        self._timeout = timeout
        self._cached: _Reading | None = None
        self._cached_at = 0.0
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None
        self._last_logged_error: str | None = None

    # -- configuration -------------------------------------------------------------

    @property
    def cli(self) -> str:
        value = getattr(self.env, "tailscale_cli", DEFAULT_CLI)
        return str(value).strip() if value else DEFAULT_CLI

    def configured(self) -> bool:
        # a good answer still in the cache proves the command was there; looking again costs a
        # stat (a PATH search for a binary) on every signed peer forward
        fresh = self._fresh()
        if fresh is not None and fresh.status is not None:
            return True
        return _resolvable(_invocation(self.cli))

    # -- the Directory contract ----------------------------------------------------

    async def candidates(self) -> list[DirectoryCandidate]:
        if not self.configured():
            return []
        try:
            reading = await self._read()
            return self._peers(reading.status) if reading.status is not None else []
        except Exception as exc:  # noqa: BLE001 - never break discovery
            log.debug("tailscale_daemon: could not list peers: %s", exc)
            return []

    async def tailnet_status(self) -> TailnetStatus:
        if not self.configured():
            return TailnetStatus(connected=False, error=MISSING_SENTENCE)
        try:
            reading = await self._read()
            if reading.status is None:
                return TailnetStatus(connected=False, error=reading.error)
            if not reading.parsed:
                reading.parsed.append(self._status(reading.status, reading.serve, self._listen_port()))
            return reading.parsed[0]
        except Exception as exc:  # noqa: BLE001 - an unreadable status is a disconnected tailnet, said plainly
            log.debug("tailscale_daemon: could not read tailnet status: %s", exc)
            return TailnetStatus(connected=False, error=f"tailscale status could not be read ({exc})")

    def invalidate(self) -> None:
        """Forget the cached answer (after ``tailscale up``/``down`` run from here)."""
        self._cached = None

    # -- parsing -------------------------------------------------------------------

    @staticmethod
    def _peers(status: dict[str, Any]) -> list[DirectoryCandidate]:
        peers = status.get("Peer")
        if not isinstance(peers, dict):
            return []
        out: list[DirectoryCandidate] = []
        for peer in peers.values():
            if not isinstance(peer, dict):
                continue
            dns = peer.get("DNSName")
            if not isinstance(dns, str) or not normalise_fqdn(dns):
                continue  # no MagicDNS name: nothing a pairing could dial
            fqdn = normalise_fqdn(dns)
            hostname = peer.get("HostName")
            device_id = peer.get("ID")
            os_name = peer.get("OS")
            online = peer.get("Online")
            out.append(
                DirectoryCandidate(
                    node_fqdn=fqdn,
                    hostname=hostname if isinstance(hostname, str) and hostname else fqdn.split(".")[0],
                    source=TailscaleDaemonDirectory.name,
                    device_id=str(device_id) if isinstance(device_id, (str, int)) and device_id != "" else "",
                    os=os_name if isinstance(os_name, str) and os_name else None,
                    online=online if isinstance(online, bool) else None,
                )
            )
        return out

    def _listen_port(self) -> int | None:
        """This node's own port (``HUB_POOL_LISTEN``): what a serve handler must proxy to."""
        try:
            host_port = getattr(self.env, "host_port", None)
            return int(host_port[1]) if host_port else None
        except (TypeError, ValueError, IndexError):
            return None

    @staticmethod
    def _status(status: dict[str, Any], serve: dict[str, Any] | None = None,
                port: int | None = None) -> TailnetStatus:
        state = status.get("BackendState")
        state = state if isinstance(state, str) and state else None
        connected = state == "Running"
        me = status.get("Self")
        me = me if isinstance(me, dict) else {}
        self_dns = me.get("DNSName")
        self_fqdn = normalise_fqdn(self_dns) if isinstance(self_dns, str) else ""
        online = me.get("Online") if isinstance(me.get("Online"), bool) else None

        tailnet = status.get("CurrentTailnet")
        tailnet = tailnet if isinstance(tailnet, dict) else {}
        suffix = status.get("MagicDNSSuffix") or tailnet.get("MagicDNSSuffix")
        suffix = normalise_fqdn(suffix) if isinstance(suffix, str) else ""
        if tailnet.get("MagicDNSEnabled") is False:
            suffix = ""
        name = tailnet.get("Name")
        tailnet_name = name.strip() if isinstance(name, str) and name.strip() else None

        https_certs: bool | None = None
        if connected and self_fqdn:
            # the daemon lists the names it can get a certificate for; with HTTPS off for the
            # tailnet the key is absent or empty, and https://<name> cannot be served
            domains = status.get("CertDomains")
            names = {normalise_fqdn(d) for d in domains if isinstance(d, str)} if isinstance(domains, list) else set()
            https_certs = self_fqdn in names
        serving, serve_detail = _serving(serve, self_fqdn, port) if connected and self_fqdn else (None, None)
        error = None
        if not connected and state is not None:
            error = _STATE_SENTENCES.get(
                state, f"Tailscale's backend state is {state}, not Running: run `tailscale up`")
        return TailnetStatus(
            connected=connected,
            self_fqdn=self_fqdn or None,
            suffix=suffix or None,
            serving=serving,
            error=error,
            https_certs=https_certs,
            online=online,
            backend_state=state,
            tailnet_name=tailnet_name,
            serve_detail=serve_detail,
        )

    # -- reading, cached -----------------------------------------------------------

    def _get_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock_loop is not loop:
            self._lock = asyncio.Lock()
            self._lock_loop = loop
        return self._lock

    def _fresh(self) -> _Reading | None:
        if self._cached is None:
            return None
        if self._clock() - self._cached_at >= self._cache_seconds:
            return None
        return self._cached

    async def _read(self) -> _Reading:
        cached = self._fresh()
        if cached is not None:
            return cached
        async with self._get_lock():
            cached = self._fresh()  # another caller may have read while we waited
            if cached is not None:
                return cached
            reading = await self._read_uncached()
            self._cached = reading
            self._cached_at = self._clock()
            self._log(reading)
            return reading

    def _log(self, reading: _Reading) -> None:
        if reading.error is None:
            self._last_logged_error = None
            return
        level = logging.WARNING if reading.error != self._last_logged_error else logging.DEBUG
        log.log(level, "tailscale_daemon: %s", reading.error)
        self._last_logged_error = reading.error

    async def _read_uncached(self) -> _Reading:
        inv = _invocation(self.cli)
        if not _resolvable(inv):
            return _Reading(None, MISSING_SENTENCE)
        assert inv is not None
        if inv.json_path is not None:
            try:
                raw = inv.json_path.read_bytes()
            except OSError as exc:
                return _Reading(None, f"could not read {inv.json_path} ({exc.strerror or exc})")
            reading = self._parse(raw, str(inv.json_path))
        else:
            reading = await self._run(inv.argv)
        if reading.status is None or reading.status.get("BackendState") != "Running":
            return reading  # nothing is served by a daemon that is not up: not asked
        return _Reading(reading.status, None, await self._serve_status(inv))

    async def _serve_status(self, inv: _Invocation) -> dict[str, Any] | None:
        """`tailscale serve status --json`, or None when it cannot be read (an older daemon, no
        permission, no recorded answer): serving then reads as "cannot tell", never as "no"."""
        if inv.serve_path is not None:
            if not inv.serve_path.is_file():
                return None
            try:
                reading = self._parse(inv.serve_path.read_bytes(), str(inv.serve_path))
            except OSError:
                return None
        else:
            reading = await self._run(inv.serve_argv)
        if reading.status is None:
            log.debug("tailscale_daemon: serve status unavailable: %s", reading.error)
        return reading.status

    async def _run(self, argv: tuple[str, ...]) -> _Reading:
        shown = shlex.join(argv)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except FileNotFoundError:
            return _Reading(None, MISSING_SENTENCE)
        except OSError as exc:
            return _Reading(None, f"{shown} could not be started ({exc.strerror or exc})")
        try:
            stdout, stderr = await asyncio.wait_for(proc.communicate(), self._timeout)
        except TimeoutError:
            await self._kill(proc)
            return _Reading(None, f"{shown} did not answer within {self._timeout:g} s")
        except BaseException:
            await self._kill(proc)
            raise
        if proc.returncode != 0:
            why = _first_line(stderr) or _first_line(stdout)
            detail = f": {why}" if why else ""
            return _Reading(None, f"{shown} failed (exit {proc.returncode}){detail}")
        return self._parse(stdout, shown)

    @staticmethod
    async def _kill(proc: asyncio.subprocess.Process) -> None:
        if proc.returncode is not None:
            return
        try:
            proc.kill()
        except ProcessLookupError:
            return
        try:
            await asyncio.wait_for(proc.wait(), 2.0)
        except Exception:  # noqa: BLE001 - best-effort reap of a killed child; nothing to report
            pass

    @staticmethod
    def _parse(raw: bytes, where: str) -> _Reading:
        try:
            status = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return _Reading(None, f"{where} answered something that is not JSON")
        if not isinstance(status, dict):
            return _Reading(None, f"{where} answered JSON that is not a status object")
        return _Reading(status, None)


__all__ = ["TailscaleDaemonDirectory", "normalise_fqdn", "MISSING_SENTENCE"]
