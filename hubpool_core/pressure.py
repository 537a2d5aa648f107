"""The GPU-pressure source contract.

A pressure plugin registers :class:`PressureSource` subclasses through
``hubpool_register_pressure_sources``. The core's sampler calls :meth:`read` every
10 s, off the request path, in ``order``; the first source that returns a number wins.
The core owns smoothing (EWMA) and the 0..3 bands; a source only reads.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar


class PressureSource(ABC):
    """One way to read how busy this node's GPU is."""

    #: Plugin-visible name, also reported as ``gpuPressureSource`` (``amd_drm``).
    name: ClassVar[str]
    #: Position among sources, with gaps (100, 200, ...); lower is tried first.
    order: ClassVar[int] = 500

    def __init__(self, env: Any) -> None:
        self.env = env

    @abstractmethod
    def read(self) -> float | None:
        """Busy fraction from 0.0 to 1.0 right now, or ``None`` for "cannot measure
        here" (no device, unreadable file, stale data). ``None`` is never idle: the
        core reads an unmeasured node as mid-band. Must not block for long (it runs in
        a worker thread) and must not raise."""
