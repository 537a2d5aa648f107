"""busyPercent from a JSON file: the extension seam for GPUs the node cannot read itself
(NVIDIA through nvidia-smi, Apple through powermetrics: see docs/gpu-pressure.md)."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from hubpool_core import PressureSource

DEFAULT_PATH = "/var/lib/hubpool/gpu_pressure.json"
#: a file not rewritten for this long is stale: its writer stopped, so nothing is measured
MAX_AGE_S = 60.0


class HostFilePressure(PressureSource):
    """Reads ``{"busyPercent": 0..100}`` from ``HUB_POOL_PRESSURE_HOST_FILE``.

    ``None`` (cannot measure) when the file is missing, unreadable, not JSON, older than
    MAX_AGE_S by its modification time, or its busyPercent is not a finite 0..100 number.
    """

    name = "host_file"
    order = 100

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        self.path = Path(getattr(env, "pressure_host_file", None) or DEFAULT_PATH)

    def read(self) -> float | None:
        try:
            stat = os.stat(self.path)
            if time.time() - stat.st_mtime > MAX_AGE_S:
                return None
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        value = data.get("busyPercent") if isinstance(data, dict) else None
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            return None
        if not 0 <= value <= 100:
            return None
        return value / 100.0
