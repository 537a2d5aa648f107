"""Small helpers for tests that drive the simulator: read its bodies, wait on its counters."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any


def sse_events(text: str) -> list[Any]:
    """The ``data:`` payloads of an SSE body, JSON-decoded, with "[DONE]" kept as the string."""
    events = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            data = block.removeprefix("data: ")
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def ndjson_lines(text: str) -> list[dict[str, Any]]:
    """The objects of an NDJSON body (Ollama's native streams)."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def wait_until(predicate: Callable[[], bool], timeout: float = 3.0, interval: float = 0.01) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` passes; returns its last value.

    Counters such as ``aborted`` change when the server notices a hang-up, a moment after
    the client closed, so tests wait for them rather than read them once.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
