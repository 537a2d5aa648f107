"""The HTTP client engine probes run through: httpx's interface, aiohttp's cost for a GET.

At ``poolProbeSnapshotTtlMs`` 0 (the spec's default) every pooled request probes every local
engine live, so a probe's GETs sit in front of the first token. Through httpx a GET cost
0.54 ms of the node's CPU on the build machine, aiohttp's 0.14 ms; a llama-server probe is
three GETs side by side (1.8 ms through httpx, 0.4 ms through aiohttp). The engine plugins'
contract stays an ``httpx.AsyncClient``: :class:`ProbeClient` is one, and
:meth:`hubpool_core.engine.Engine.get_json` — the one GET every built-in probe goes
through — sends through :meth:`ProbeClient.fast_get` when it is handed one. Anything else a
plugin does with the client (``post``, ``stream``) is plain httpx.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aiohttp
import httpx


class FastAnswer:
    """What :meth:`ProbeClient.fast_get` read: the two things ``get_json`` asks of a response."""

    __slots__ = ("content", "status_code")

    def __init__(self, status_code: int, content: bytes):
        self.status_code = status_code
        self.content = content

    def json(self) -> Any:
        return json.loads(self.content)


class ProbeClient(httpx.AsyncClient):
    """An ``httpx.AsyncClient`` whose GETs for :meth:`Engine.get_json` go through aiohttp.

    The aiohttp session is made inside the running loop on first use and keeps its
    connections, as httpx's pool does. :meth:`fast_get` raises the httpx exception a plain
    ``get`` would have raised for the same failure, so the callers' sentences for the
    operator (refused, timed out, read error) are the same whichever path ran."""

    def __init__(self, *, timeout: float, **kwargs: Any):
        super().__init__(timeout=timeout, trust_env=False, **kwargs)
        self._timeout_s = timeout
        self._session: aiohttp.ClientSession | None = None

    def _aiohttp(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                auto_decompress=True, trust_env=False,
                connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
                timeout=self._client_timeout(self._timeout_s))
        return self._session

    @staticmethod
    def _client_timeout(seconds: float) -> aiohttp.ClientTimeout:
        # httpx's one number bounds the connect and each read; aiohttp's ``total`` would
        # bound the whole exchange, which httpx does not
        return aiohttp.ClientTimeout(total=None, sock_connect=seconds, sock_read=seconds)

    async def fast_get(self, url: str, headers: Mapping[str, str] | None = None,
                       timeout: float | None = None) -> FastAnswer:
        """GET ``url`` and read the whole body; failures raise as httpx's would."""
        kwargs: dict[str, Any] = {} if timeout is None else {"timeout": self._client_timeout(timeout)}
        try:
            async with self._aiohttp().get(url, headers=dict(headers or {}), allow_redirects=False,
                                           **kwargs) as response:
                return FastAnswer(response.status, await response.read())
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise as_httpx_error(exc, url) from exc

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        await super().aclose()


def as_httpx_error(exc: BaseException, url: str) -> httpx.HTTPError | httpx.InvalidURL:
    """The httpx exception a plain ``get`` raises for the failure aiohttp reported as ``exc``
    (the request is attached only here: building one costs what the fast path saves)."""
    request = httpx.Request("GET", url) if not isinstance(exc, aiohttp.InvalidURL) else None
    text = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(text, request=request)
    if isinstance(exc, TimeoutError):  # aiohttp's read timeouts are TimeoutErrors too
        return httpx.ReadTimeout(text, request=request)
    if isinstance(exc, aiohttp.InvalidURL):
        return httpx.InvalidURL(f"invalid URL {url!r}")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(text, request=request)
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError)):
        return httpx.ReadError(text, request=request)  # after the connect: something listened
    if isinstance(exc, aiohttp.ClientResponseError):
        return httpx.RemoteProtocolError(text, request=request)  # a malformed answer
    return httpx.TransportError(text, request=request)
