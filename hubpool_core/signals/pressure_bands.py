"""GPU pressure as a band: EWMA smoothing and a deadband quantiser (spec: GPU pressure).

Readings are smoothed with α = 0.4 and quantised into 0..3. A band is entered at
0.40/0.70/0.85 occupancy and left at 0.35/0.65/0.80, so a value oscillating across a
boundary does not flap the number every peer ranks on. Rises may skip bands; falls walk
down one band per sample.
"""

from __future__ import annotations

from dataclasses import dataclass

ALPHA = 0.4
ENTER = (0.40, 0.70, 0.85)  # the occupancy that enters band 1, 2, 3
LEAVE = (0.35, 0.65, 0.80)  # below this, band 1, 2, 3 is left
UNKNOWN_PRESSURE = 1
MAX_PRESSURE_BAND = 3


def rise_target(value: float) -> int:
    band = 0
    for i, threshold in enumerate(ENTER, start=1):
        if value >= threshold:
            band = i
    return band


@dataclass
class BandQuantiser:
    """Feed busy fractions; ``band`` is None until the first reading."""

    ewma: float | None = None
    band: int | None = None

    def feed(self, reading: float) -> int:
        reading = min(1.0, max(0.0, reading))
        self.ewma = reading if self.ewma is None else ALPHA * reading + (1 - ALPHA) * self.ewma
        if self.band is None:
            self.band = rise_target(self.ewma)
            return self.band
        target = rise_target(self.ewma)
        if target > self.band:
            self.band = target  # rises may skip bands
        elif self.band > 0 and self.ewma < LEAVE[self.band - 1]:
            self.band -= 1  # falls walk down one at a time
        return self.band

    def reset(self) -> None:
        self.ewma = None
        self.band = None


def read_band(value: object) -> int | None:
    """A band from a peer's JSON: an integer 0..3, else None (absent, stale or invalid)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_PRESSURE_BAND:
        return value
    return None


def wire_source_name(plugin_name: str) -> str:
    """gpuPressureSource on the wire spells the plugin name with hyphens (``host-file``)."""
    return plugin_name.replace("_", "-")
