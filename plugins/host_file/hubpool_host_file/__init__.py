"""The vendor-neutral GPU-pressure source: a JSON file written by whatever can see the GPU."""

from hubpool_core import hookimpl
from hubpool_host_file.source import HostFilePressure


@hookimpl
def hubpool_register_pressure_sources(register):
    """Register the host-file pressure source (tried first, order 100)."""
    register(HostFilePressure)
