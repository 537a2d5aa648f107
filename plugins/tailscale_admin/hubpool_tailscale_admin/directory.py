"""The Tailscale Admin API as a directory.

With an OAuth client configured (``env.tailscale_oauth_client_id`` and
``env.tailscale_oauth_client_secret``), it exchanges the client credentials for an
access token at ``{api}/api/v2/oauth/token`` (cached until a minute before it expires)
and lists ``{api}/api/v2/tailnet/<tailnet>/devices``, where ``<tailnet>`` is the tailnet
name the local daemon reports (``CurrentTailnet.Name`` of ``tailscale status --json``,
through :attr:`Directory.local_tailnet`) — not ``-``, the credential's default tailnet,
which is another tailnet whenever the OAuth client belongs to one this node has not
joined. A node whose daemon names no tailnet asks nothing (outside a node, with no
``local_tailnet`` wired, ``-`` is used). ``env.tailscale_api_url`` (default
``https://api.tailscale.com``) moves the API, for tests.

Without both credentials it is not configured and makes zero network calls. Every
failure — unreachable, a 4xx/5xx, an answer that is not the expected JSON — is an empty
answer (``[]`` / ``None``) and a WARNING line the first time it happens (debug while the
same failure repeats; one line again when it clears), and :meth:`problem` names it for
``hubpool doctor``: an unreachable Admin API degrades pairing's membership check to the
MagicDNS suffix, which the operator must be able to see. Nothing raises, and neither the
client secret nor a token ever reaches a log line.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx

from hubpool_core import Directory, DirectoryCandidate

log = logging.getLogger(__name__)

DEFAULT_API_URL = "https://api.tailscale.com"
TOKEN_PATH = "/api/v2/oauth/token"
DEVICES_PATH = "/api/v2/tailnet/{tailnet}/devices"
#: the credential's own tailnet, used only when no node says which tailnet it is on
DEFAULT_TAILNET = "-"
TIMEOUT_SECONDS = 10.0
#: Drop a cached token this long before the API says it expires.
TOKEN_MARGIN_SECONDS = 60.0
#: ``expires_in`` when the token answer omits it (Tailscale issues one-hour tokens).
DEFAULT_TOKEN_LIFETIME = 3600.0


class AdminApiError(Exception):
    """A failed Admin API step; its message is safe to log (no secret, no token)."""


class _Unauthorized(AdminApiError):
    pass


def normalise_fqdn(name: str) -> str:
    """``Hub-B.Example-Tailnet.ts.net.`` -> ``hub-b.example-tailnet.ts.net``."""
    return name.strip().rstrip(".").lower()


def _setting(env: Any, name: str) -> str:
    value = getattr(env, name, None)
    if value is None:
        return ""
    # pydantic SecretStr and friends
    getter = getattr(value, "get_secret_value", None)
    if callable(getter):
        value = getter()
    return str(value).strip()


class TailscaleAdminDirectory(Directory):
    """Every device the Tailscale Admin API lists for this OAuth client's tailnet.

    Reads ``env.tailscale_oauth_client_id``, ``env.tailscale_oauth_client_secret`` and
    ``env.tailscale_api_url``. ``transport`` (an ``httpx`` transport) is for tests.
    """

    name = "tailscale_admin"
    is_tailnet = True

    def __init__(
        self,
        env: Any,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        timeout: float = TIMEOUT_SECONDS,
    ) -> None:
        super().__init__(env)
        self._transport = transport
        self._clock = clock
        self._timeout = timeout
        self._token: str | None = None
        self._token_until = 0.0
        self._token_for: tuple[str, str, str] | None = None
        #: whether the last ``_access_token`` answered from the cache
        self._reused = False
        #: why the last device list failed (None: it answered, or was never asked)
        self._problem: str | None = None

    # -- configuration -------------------------------------------------------------

    @property
    def api_url(self) -> str:
        return (_setting(self.env, "tailscale_api_url") or DEFAULT_API_URL).rstrip("/")

    def _credentials(self) -> tuple[str, str]:
        return (
            _setting(self.env, "tailscale_oauth_client_id"),
            _setting(self.env, "tailscale_oauth_client_secret"),
        )

    def configured(self) -> bool:
        client_id, secret = self._credentials()
        return bool(client_id and secret)

    # -- the Directory contract ----------------------------------------------------

    async def candidates(self) -> list[DirectoryCandidate]:
        devices = await self._devices()
        if devices is None:
            return []
        return [c for c in (self._candidate(d) for d in devices) if c is not None]

    async def members(self) -> set[str] | None:
        devices = await self._devices()
        if devices is None:
            return None
        names = set()
        for device in devices:
            name = device.get("name") if isinstance(device, dict) else None
            if isinstance(name, str) and normalise_fqdn(name):
                names.add(normalise_fqdn(name))
        return names

    def problem(self) -> str | None:
        return self._problem

    def forget_token(self) -> None:
        """Drop the cached access token (the next call exchanges a new one)."""
        self._token = None
        self._token_until = 0.0
        self._token_for = None

    # -- parsing -------------------------------------------------------------------

    @classmethod
    def _candidate(cls, device: Any) -> DirectoryCandidate | None:
        if not isinstance(device, dict):
            return None
        name = device.get("name")
        if not isinstance(name, str) or not normalise_fqdn(name):
            return None
        fqdn = normalise_fqdn(name)
        hostname = device.get("hostname")
        device_id = device.get("nodeId") or device.get("id")
        os_name = device.get("os")
        online = device.get("connectedToControl")
        return DirectoryCandidate(
            node_fqdn=fqdn,
            hostname=hostname if isinstance(hostname, str) and hostname else fqdn.split(".")[0],
            source=cls.name,
            device_id=str(device_id) if isinstance(device_id, (str, int)) and device_id != "" else "",
            os=os_name if isinstance(os_name, str) and os_name else None,
            online=online if isinstance(online, bool) else None,
        )

    # -- HTTP ----------------------------------------------------------------------

    async def _devices(self) -> list[Any] | None:
        """The raw device list, or ``None`` when unconfigured or on any failure."""
        if not self.configured():
            return None
        try:
            tailnet = await self._tailnet()
        except AdminApiError as exc:
            self._failed(str(exc), logging.INFO)  # C1 already says the node is off its tailnet
            return None
        try:
            async with httpx.AsyncClient(
                transport=self._transport,
                timeout=self._timeout,
                follow_redirects=False,
            ) as client:
                try:
                    devices = await self._list(client, await self._access_token(client), tailnet)
                except _Unauthorized:
                    if not self._reused:
                        raise
                    # the cached token was revoked or expired early: one fresh exchange
                    self.forget_token()
                    devices = await self._list(client, await self._access_token(client), tailnet)
        except asyncio.CancelledError:
            raise
        except AdminApiError as exc:
            self._failed(str(exc))
            return None
        except httpx.HTTPError as exc:
            self._failed(f"{type(exc).__name__} reaching {self.api_url}")
            return None
        except Exception as exc:  # noqa: BLE001 - never break discovery, never leak a credential
            self._failed(f"unexpected {type(exc).__name__}")
            return None
        if self._problem is not None:
            log.info("tailscale_admin: the Admin API answers again for tailnet %s", tailnet)
        self._problem = None
        return devices

    def _failed(self, why: str, level: int = logging.WARNING) -> None:
        """Log a failure the operator can see: once at ``level`` when it starts or changes, at
        debug while it repeats (discovery and every inbound pairing ask again)."""
        sentence = f"the Admin API is unavailable: {why}; pairing checks only the MagicDNS suffix"
        log.log(level if sentence != self._problem else logging.DEBUG, "tailscale_admin: %s", sentence)
        self._problem = sentence

    async def _tailnet(self) -> str:
        """The tailnet to ask about: the one the local daemon reports."""
        if self.local_tailnet is None:
            return DEFAULT_TAILNET
        status = await self.local_tailnet()
        if not status.connected or not status.tailnet_name:
            raise AdminApiError("this node's Tailscale daemon reports no tailnet it has joined, so there is no "
                                "tailnet to ask about")
        return status.tailnet_name

    async def _access_token(self, client: httpx.AsyncClient) -> str:
        client_id, secret = self._credentials()
        key = (self.api_url, client_id, secret)
        now = self._clock()
        if self._token and self._token_for == key and now < self._token_until:
            self._reused = True
            return self._token
        self._reused = False
        self.forget_token()
        response = await client.post(
            self.api_url + TOKEN_PATH,
            data={
                "grant_type": "client_credentials",
                "client_id": client_id,
                "client_secret": secret,
            },
            headers={"Accept": "application/json"},
        )
        if response.status_code != 200:
            raise AdminApiError(f"the OAuth token exchange answered HTTP {response.status_code}")
        try:
            body = response.json()
        except ValueError:
            raise AdminApiError("the OAuth token exchange answered something that is not JSON") from None
        token = body.get("access_token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token:
            raise AdminApiError("the OAuth token exchange answered no access_token")
        expires_in = body.get("expires_in", DEFAULT_TOKEN_LIFETIME)
        if isinstance(expires_in, bool) or not isinstance(expires_in, (int, float)):
            expires_in = DEFAULT_TOKEN_LIFETIME
        self._token = token
        self._token_for = key
        self._token_until = now + max(0.0, float(expires_in) - TOKEN_MARGIN_SECONDS)
        return token


    async def _list(self, client: httpx.AsyncClient, token: str, tailnet: str) -> list[Any]:
        response = await client.get(
            self.api_url + DEVICES_PATH.format(tailnet=quote(tailnet, safe="")),
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
        )
        if response.status_code in (401, 403):
            if response.status_code == 401:
                raise _Unauthorized("the device list answered HTTP 401")
            raise AdminApiError("the device list answered HTTP 403 (the OAuth client needs devices:core:read)")
        if response.status_code != 200:
            raise AdminApiError(f"the device list answered HTTP {response.status_code}")
        try:
            body = response.json()
        except ValueError:
            raise AdminApiError("the device list answered something that is not JSON") from None
        devices = body.get("devices") if isinstance(body, dict) else None
        if not isinstance(devices, list):
            raise AdminApiError("the device list answered JSON without a devices array")
        return devices


__all__ = ["AdminApiError", "TailscaleAdminDirectory", "normalise_fqdn"]
