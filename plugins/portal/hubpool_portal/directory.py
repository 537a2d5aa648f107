"""The CI Portal device registry as a directory: wired in, names nothing today.

The spec ("Where pairing candidates come from") lists the Portal registry as the third
directory and then says the leg "contributes no candidates today, for two independent
reasons":

1. **Auth.** The reference implementation lists ``GET <portal>/api/devices`` with the
   device key, but that route sits behind Portal's browser-session middleware; a device
   key is not a session, so the call is refused.
2. **Shape.** A candidate is named from a ``tailscaleDns`` field alone, and the Portal
   device table has nothing tailnet-shaped (``device_id``, ``api_key``, ``name``,
   ``slug``, ``status``, ``pairing_code``, ``catalog_channel``). Even with a session
   every row would be skipped for having no MagicDNS name.

Fixing it is a Portal change (a device-key-authenticated listing that carries a
MagicDNS name), not a Hub one. Until then this directory answers ``[]`` without any
network call — a call that can only be refused would only add latency and a failure
mode to discovery — and says so in a debug line, so an empty Portal leg is never
mistaken for a broken one. When Portal grows such a listing, :meth:`candidates` is
where it goes: rows without a MagicDNS name (LAN-only devices) are skipped, IP
literals are refused, and each row carries ``source="portal"``.
"""

from __future__ import annotations

import logging
from typing import Any

from hubpool_core import Directory, DirectoryCandidate

log = logging.getLogger(__name__)

WHY_EMPTY = (
    "the Portal registry names no pool peers yet (its device listing needs a browser "
    "session and carries no MagicDNS name); pair by tailnet name or by address and PIN"
)


class PortalDirectory(Directory):
    """Hub devices registered to the same Portal account: none, today.

    Reads ``env.portal_url``; ``configured()`` is whether it is set. ``candidates()``
    is always ``[]`` and never touches the network (see the module docstring).
    """

    name = "portal"

    def __init__(self, env: Any) -> None:
        super().__init__(env)

    def configured(self) -> bool:
        url = getattr(self.env, "portal_url", None)
        return bool(url and str(url).strip())

    async def candidates(self) -> list[DirectoryCandidate]:
        if self.configured():
            log.debug("portal: %s", WHY_EMPTY)
        return []


__all__ = ["PortalDirectory", "WHY_EMPTY"]
