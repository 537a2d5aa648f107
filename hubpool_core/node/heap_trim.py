"""Give freed heap memory back to the operating system after bursts of requests.

glibc's allocator keeps the pages a burst freed (connection buffers, request bodies, short-lived
dicts) mapped, so a node that once served 64 clients at once stays that large while idle.
``malloc_trim(0)`` returns free pages anywhere in the heap; run on a timer and only after the
node served something, it costs a few milliseconds at most every ``TRIM_INTERVAL_S``. Where the C
library has no ``malloc_trim`` (musl, macOS) this does nothing.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable

from hubpool_core.periodic import Periodic

log = logging.getLogger("hubpool.heap")

TRIM_INTERVAL_S = 10.0


def _find_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the C library the interpreter runs on
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


class HeapTrimmer:
    """Trims the heap every ``TRIM_INTERVAL_S`` seconds when ``activity()`` moved since the last trim."""

    def __init__(self, activity: Callable[[], int]):
        self.activity = activity
        self._trim = _find_trim()
        #: the activity figure at the last trim
        self.seen = -1
        self.trims = 0
        self._loop = Periodic("heap trim", self.step, lambda: TRIM_INTERVAL_S)

    @property
    def available(self) -> bool:
        return self._trim is not None

    async def step(self) -> None:
        now = self.activity()
        if self._trim is None or now == self.seen:
            return
        self._trim(0)
        self.trims += 1
        # last, so a reader in another thread never sees ``seen`` moved while ``trims`` has not
        # (the C call releases the GIL for as long as the trim takes)
        self.seen = now

    def start(self) -> None:
        if self._trim is None:
            log.debug("malloc_trim is not available here; freed heap stays mapped")
            return
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
