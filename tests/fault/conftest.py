"""The fault suite's own modules (rig, faultproxy) import each other by name: put
this directory on the path, as pyproject's pythonpath does for tests/."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

HERE = str(Path(__file__).parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)


#: where each fault test's figures go (docs/reliability.md quotes the last run)
REPORT_PATH = Path(os.environ.get("HUBPOOL_FAULT_REPORT", "/tmp/hubpool-fault-report.json"))


@pytest.fixture
def report(request):
    """``report(name, figures)``: print a test's figures and merge them into REPORT_PATH."""
    started = time.monotonic()

    def write(name: str, figures: dict) -> None:
        figures = {**figures, "testSeconds": round(time.monotonic() - started, 1)}
        print(f"\n{name}: {json.dumps(figures)}")
        try:
            data = json.loads(REPORT_PATH.read_text())
        except (OSError, ValueError):
            data = {}
        data[name] = figures
        REPORT_PATH.write_text(json.dumps(data, indent=1, sort_keys=True))

    return write
