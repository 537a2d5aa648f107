"""Kill switches: resolved here and nowhere else (spec: Kill switches, one precedence).

Highest first: HUB_POOL_USER_DISABLED, poolEnabled, HUB_POOL_{OUTBOUND,INBOUND}_DISABLED,
poolOutboundEnabled/poolInboundEnabled; the per-peer switch is applied per peer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ENV_MASTER_TEXT = "Hub pooling is disabled on this node (HUB_POOL_USER_DISABLED)"
SETTING_MASTER_TEXT = "Hub pooling is disabled on this node (turned off in Settings → Network → Hub Pool)"


@dataclass(frozen=True)
class Direction:
    enabled: bool
    disabled_by: str | None  # env | setting | None


@dataclass(frozen=True)
class Directions:
    master: Direction
    outbound: Direction
    inbound: Direction

    def describe_master(self) -> str | None:
        if self.master.enabled:
            return None
        return ENV_MASTER_TEXT if self.master.disabled_by == "env" else SETTING_MASTER_TEXT

    def status_fields(self, connected_peers: int, connected_enabled_peers: int) -> dict[str, Any]:
        if not self.master.enabled:
            reason = "disabled_by_env" if self.master.disabled_by == "env" else "disabled_by_setting"
        elif not self.outbound.enabled or not self.inbound.enabled or (connected_peers and not connected_enabled_peers):
            reason = "partially_disabled"
        else:
            reason = "active" if connected_peers else "no_peers"
        return {
            "enabled": self.master.enabled,
            "disabledBy": self.master.disabled_by,
            "reason": reason,
            "directions": {
                "outbound": {"enabled": self.outbound.enabled, "disabledBy": self.outbound.disabled_by},
                "inbound": {"enabled": self.inbound.enabled, "disabledBy": self.inbound.disabled_by},
            },
            "routingActive": self.outbound.enabled and connected_enabled_peers > 0,
        }


def resolve_directions(env: Any, settings: Any) -> Directions:
    if env.user_disabled == "true":
        off = Direction(False, "env")
        return Directions(off, off, off)
    if settings.poolEnabled is False:
        off = Direction(False, "setting")
        return Directions(off, off, off)

    def one(env_flag: str | None, setting: bool) -> Direction:
        if env_flag == "true":
            return Direction(False, "env")
        if setting is False:
            return Direction(False, "setting")
        return Direction(True, None)

    return Directions(
        Direction(True, None),
        one(env.outbound_disabled, settings.poolOutboundEnabled),
        one(env.inbound_disabled, settings.poolInboundEnabled),
    )
