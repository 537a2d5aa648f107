"""This node's place on the tailnet, asked of the directories that can say."""

from __future__ import annotations

import json
import logging
from typing import Any

from hubpool_core.directory import Directory, TailnetStatus
from hubpool_core.peering.signing import normalize_peer_fqdn

log = logging.getLogger("hubpool.tailnet")

NOT_CONNECTED = TailnetStatus(connected=False, error="no directory plugin reports a tailnet")


class Tailnet:
    def __init__(self, directories: list[Directory]):
        self.directories = directories
        for directory in directories:
            # a directory that asks a remote API about "this tailnet" names the one the local
            # daemon reports (the Admin API's `-` would be the credential's default tailnet)
            directory.local_tailnet = self.status

    async def status(self) -> TailnetStatus:
        """The first directory that knows wins; plugins cache (the daemon's for 30 s)."""
        for directory in self.directories:
            if not directory.configured():
                continue
            try:
                status = await directory.tailnet_status()
            except Exception as exc:  # noqa: BLE001 - a plugin bug reads as "not on a tailnet"
                log.warning("directory %s failed to report tailnet status: %s", directory.name, exc)
                continue
            if status is not None:
                return status
        return NOT_CONNECTED

    async def self_fqdn(self) -> str | None:
        return normalize_peer_fqdn((await self.status()).self_fqdn)

    async def suffix(self) -> str | None:
        status = await self.status()
        return status.suffix.strip(".").lower() if status.suffix else None

    async def name_refusal(self, fqdn: str, *, unknown_suffix_ok: bool) -> str | None:
        """Why ``fqdn`` (normalised) is not a device of this tailnet, or None when it may be.

        It must be under this tailnet's MagicDNS suffix and, where a directory can list the
        tailnet's devices (the Admin API, with its credential), one of them; a directory that
        cannot answer is passed over (the check falls back to the suffix, and the directory
        says so itself). ``unknown_suffix_ok``: what to answer while no suffix is known — a
        pairing request to a node on no tailnet has nothing to compare against and is let in;
        a name a peer taught this node (a rename, a pair-by-address answer) is not, because
        this node would then dial it for every forward."""
        suffix = await self.suffix()
        if suffix is None:
            return None if unknown_suffix_ok else "this node cannot tell its tailnet's MagicDNS suffix right now"
        if not fqdn.endswith("." + suffix):
            return f"{fqdn} is not under this tailnet's MagicDNS suffix ({suffix})"
        for directory in self.directories:
            if not directory.configured():
                continue
            try:
                members = await directory.members()
            except Exception:  # noqa: BLE001 - an unreachable Admin API degrades to the suffix check
                members = None
            if members is not None and fqdn not in {normalize_peer_fqdn(m) for m in members}:
                return f"{fqdn} is not a device of this tailnet (the {directory.name} directory does not list it)"
        return None


def peer_url_overrides(raw: str | None) -> dict[str, str]:
    """HUB_POOL_PEER_URLS: a JSON map of FQDN to base URL, for several nodes on one machine."""
    if not raw:
        return {}
    try:
        data: Any = json.loads(raw)
    except ValueError:
        log.error("HUB_POOL_PEER_URLS is not a JSON object of FQDN to base URL; ignoring it")
        return {}
    if not isinstance(data, dict):
        log.error("HUB_POOL_PEER_URLS must be a JSON object; ignoring it")
        return {}
    out = {}
    for name, url in data.items():
        fqdn = normalize_peer_fqdn(name)
        if fqdn and isinstance(url, str) and url.startswith(("http://", "https://")):
            out[fqdn] = url.rstrip("/")
    return out
