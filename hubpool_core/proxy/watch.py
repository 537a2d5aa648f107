"""Watching a committed stream (issue 28 items 2 and 3): a stall ends it, and so does a loop.

Once a stream is committed no byte of it can be recalled, but the node still reads every
chunk as it passes. ``poolStreamStallMs`` without new content — keep-alives do not count —
ends the attempt as ``stalled``: the upstream is closed (which is how its engine learns to
stop), the engine is struck as for an output fault, and the app gets the dialect's error
event instead of a socket that never times out. The loop rule (proxy/loops.py) ends it as
``degenerate-loop`` the same way. With ``poolStreamResume`` the pump continues such a stream
on the next candidate instead (proxy/resume.py).

The stall costs one clock read per chunk and one timer per stall period, never a task or a
timeout per read; the loop rule one regex search per chunk (proxy/content.py).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import aiohttp

from hubpool_core.engine import RESPONSES
from hubpool_core.proxy.content import generated_text, only_keepalives, text_pattern
from hubpool_core.proxy.front import error_event
from hubpool_core.proxy.loops import LoopGuard
from hubpool_core.proxy.plan import RelayPlan
from hubpool_core.proxy.response_homes import response_id

STALLED = "stalled"
LOOPING = "degenerate-loop"
#: the shortest stall honoured, whatever the setting says
MIN_STALL_MS = 100
_SEQUENCE = re.compile(rb'"sequence_number":\s*(\d{1,12})')


class StreamWatch:
    """One committed stream's stall timer and loop guard (either may be off). ``ended`` is
    the fault that ended the stream (``STALLED`` or ``LOOPING``), else None."""

    __slots__ = ("stall_s", "last", "ended", "detail", "guard", "pattern", "_timer", "_upstream", "_loop")

    def __init__(self, upstream: aiohttp.ClientResponse, dialect: str, stall_ms: int, loops: bool):
        self._upstream = upstream
        self.stall_s = max(stall_ms, MIN_STALL_MS) / 1000 if stall_ms > 0 else 0.0
        self.last = time.monotonic()
        self.ended: str | None = None
        self.detail = ""
        self.guard = LoopGuard() if loops else None
        self.pattern = text_pattern(dialect)
        self._loop = asyncio.get_running_loop()
        self._timer = self._loop.call_later(self.stall_s, self._check) if self.stall_s else None

    def _check(self) -> None:
        idle = time.monotonic() - self.last
        if idle < self.stall_s:
            self._timer = self._loop.call_later(self.stall_s - idle, self._check)
            return
        self._timer = None
        self.ended = STALLED
        self.detail = f"no content for {int(idle * 1000)} ms"
        self._upstream.close()  # wakes the pump's read; the engine sees its request closed

    def saw(self, chunk: bytes) -> bool:
        """A chunk passed; True when it completed a loop (the stream is to end now)."""
        if self.stall_s and not only_keepalives(chunk):
            self.last = time.monotonic()
        if self.guard is not None and self.guard.add(generated_text(self.pattern, chunk)):
            self.ended = LOOPING
            self.detail = self.guard.reason()
            self.stop()
            self._upstream.close()
            return True
        return False

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def reason(self) -> str:
        return f"{self.ended} ({self.detail})"


def watch_for(node: Any, plan: RelayPlan, upstream: aiohttp.ClientResponse, dialect: str) -> StreamWatch | None:
    """The watch a committed stream gets on the node the app asked (a leaf serving a forward
    leaves it to the entry node, which reads the same bytes), or None when both are off."""
    if plan.inbound_from is not None:
        return None
    settings = node.settings.current
    if not settings.poolStreamStallMs and not settings.poolStreamLoopGuard:
        return None
    return StreamWatch(upstream, dialect, settings.poolStreamStallMs, bool(settings.poolStreamLoopGuard))


def ending(plan: RelayPlan, message: str, translator: Any, first_bytes: bytes, last_frame: bytes) -> bytes:
    """The dialect's error event that ends a stream the node cut, continuing what the app has
    seen (a Responses stream: its response id and next sequence number)."""
    response = None
    sequence = None
    if plan.dialect == RESPONSES:
        if translator is not None and getattr(translator, "id", None):
            # the translator wrote the app's stream: its id, and its next sequence number
            response = {"id": translator.id, "model": plan.model}
            sequence = getattr(translator, "_seq", None)
        else:
            rid = response_id(first_bytes, whole=False) or _any_id(first_bytes)
            response = {"id": rid, "model": plan.model} if rid else None
            found = _SEQUENCE.search(last_frame)
            sequence = int(found.group(1)) + 1 if found else None
    return error_event(plan.dialect, 502, message, response=response, sequence=sequence, model=plan.model)


def _any_id(first_bytes: bytes) -> str | None:
    """A Responses stream's id even when it was not stored (response_id reads stored ones)."""
    for line in first_bytes.split(b"\n"):
        if line.startswith(b"data:") and b"response.created" in line:
            try:
                obj = json.loads(line[5:])
            except (ValueError, UnicodeDecodeError, RecursionError):
                return None
            rid = (obj.get("response") or {}).get("id") if isinstance(obj, dict) else None
            return rid if isinstance(rid, str) else None
    return None


def resume_ending(plan: RelayPlan, reason: str | None) -> bytes:
    """The error event ending a resumed stream that could not be finished."""
    resume = plan.resume
    response = {"id": resume.ident.get("id"), "model": plan.model} if resume is not None and resume.ident.get("id") \
        else None
    return error_event(plan.dialect, 502, f"hubpool could not finish this answer: {reason or 'no candidate left'}",
                       response=response, sequence=resume.seq if resume is not None else None, model=plan.model)
