"""hubpool GPU-pressure source: the amdgpu driver's ``gpu_busy_percent`` from sysfs."""

from hubpool_amd_drm.source import AmdDrmPressure
from hubpool_core import hookimpl

__all__ = ["AmdDrmPressure"]


@hookimpl
def hubpool_register_pressure_sources(register):
    """Register the AMD sysfs busy-percent source."""
    register(AmdDrmPressure)
