"""GPU pressure from the amdgpu driver's own duty-cycle counter.

Reads ``<root>/card*/device/gpu_busy_percent`` for every card (``root`` is
``env.amd_drm_root``, default ``/sys/class/drm``; in a container, the host's ``/sys``
mounted somewhere, e.g. ``/host/sys/class/drm``). Connector entries (``card0-DP-1``)
and render nodes (``renderD128``) are ignored. The reading is the busiest card's
percentage as a fraction of 1.

A card without the file (not an AMD GPU) is skipped, and so is one whose file cannot be
read or holds anything but an integer 0..100. With no card left the answer is ``None``
— "cannot measure here", which the core reads as mid-band, never as idle.

Mount the whole ``/sys``, not ``/sys/class/drm``: ``card*/device`` is a symlink into
``/sys/devices/…``, so a narrower mount leaves dangling links (``describe()`` says so).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hubpool_core import PressureSource

DEFAULT_ROOT = "/sys/class/drm"
BUSY_FILE = "gpu_busy_percent"
_CARD = re.compile(r"card(\d+)")
_MAX_BYTES = 64


@dataclass(frozen=True)
class CardReading:
    """One card's counter: ``percent`` when it read cleanly, else ``problem``."""

    card: str
    path: Path
    percent: int | None = None
    problem: str | None = None


@dataclass(frozen=True)
class Scan:
    root: Path
    root_exists: bool
    cards: tuple[str, ...] = ()
    readings: tuple[CardReading, ...] = ()
    dangling: tuple[str, ...] = ()

    @property
    def percents(self) -> list[int]:
        return [r.percent for r in self.readings if r.percent is not None]


def parse_percent(raw: bytes) -> int | None:
    """``b"37\\n"`` -> 37; anything but a plain integer 0..100 -> ``None``."""
    try:
        text = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        return None
    if not text.isdigit() or len(text) > 3:
        return None
    value = int(text)
    return value if 0 <= value <= 100 else None


def scan(root: Path) -> Scan:
    """Every card under ``root`` and what its busy counter says. Raises nothing."""
    try:
        entries = sorted(
            (e.name for e in os.scandir(root) if _CARD.fullmatch(e.name)),
            key=lambda n: int(n[4:]),
        )
    except OSError:
        return Scan(root=root, root_exists=root.is_dir())
    readings: list[CardReading] = []
    dangling: list[str] = []
    for card in entries:
        device = root / card / "device"
        path = device / BUSY_FILE
        try:
            if os.path.islink(device) and not device.exists():
                dangling.append(card)
                continue
            if not path.exists():
                continue  # not an amdgpu card
            with open(path, "rb") as f:
                raw = f.read(_MAX_BYTES)
        except OSError as exc:
            readings.append(CardReading(card, path, problem=f"could not be read ({exc.strerror or exc})"))
            continue
        percent = parse_percent(raw)
        if percent is None:
            readings.append(CardReading(card, path, problem=f"holds {raw[:20]!r}, not a percentage"))
        else:
            readings.append(CardReading(card, path, percent=percent))
    return Scan(root=root, root_exists=True, cards=tuple(entries), readings=tuple(readings), dangling=tuple(dangling))


class AmdDrmPressure(PressureSource):
    """The busiest AMD card's ``gpu_busy_percent``, as a fraction of 1.

    Reads ``env.amd_drm_root`` (``HUB_POOL_AMD_DRM_ROOT``, default ``/sys/class/drm``).
    """

    name = "amd_drm"
    order = 200

    def __init__(self, env: Any) -> None:
        super().__init__(env)

    @property
    def root(self) -> Path:
        value = getattr(self.env, "amd_drm_root", None)
        return Path(str(value)) if value else Path(DEFAULT_ROOT)

    def read(self) -> float | None:
        try:
            percents = scan(self.root).percents
        except Exception:  # noqa: BLE001 - the contract: read() never raises; None is "cannot measure"
            return None
        if not percents:
            return None
        return max(percents) / 100.0

    def describe(self) -> str:
        """One sentence for ``hubpool doctor``: which counters this source found."""
        try:
            return self._describe(scan(self.root))
        except Exception as exc:  # noqa: BLE001 - a sentence, never an error (scan raises nothing)  # pragma: no cover
            return f"The AMD GPU counter under {self.root} could not be inspected ({exc})."

    @staticmethod
    def _describe(s: Scan) -> str:
        root = s.root
        if not s.root_exists:
            return (
                f"{root} does not exist here, so no AMD GPU busy counter can be read "
                "(mount the host's /sys read-only and point HUB_POOL_AMD_DRM_ROOT at its class/drm)."
            )
        if not s.cards:
            return f"{root} lists no card* devices, so there is no GPU busy counter to read here."
        good = [r for r in s.readings if r.percent is not None]
        bad = [r for r in s.readings if r.percent is None]
        parts: list[str] = []
        if good:
            listed = ", ".join(f"{r.path} ({r.percent}%)" for r in good)
            busiest = max(r.percent for r in good if r.percent is not None)
            parts.append(f"Reading {listed}; the busiest card is at {busiest}%.")
        else:
            parts.append(f"No readable {BUSY_FILE} under {root}/card*/device, so GPU pressure is unmeasured here.")
        for r in bad:
            parts.append(f"{r.path} {r.problem}.")
        if s.dangling:
            parts.append(
                f"{', '.join(s.dangling)}/device is a dangling link: mount the whole /sys, not /sys/class/drm."
            )
        if not s.readings and not s.dangling:
            parts.append(f"Cards {', '.join(s.cards)} have no {BUSY_FILE} (not AMD GPUs, or not the amdgpu driver).")
        return " ".join(parts)


__all__ = ["AmdDrmPressure", "CardReading", "Scan", "parse_percent", "scan"]
