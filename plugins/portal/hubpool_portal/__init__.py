"""hubpool directory plugin: the CI Portal device registry.

Wired in so the merge has its third leg, but it names nothing today — see
:class:`hubpool_portal.directory.PortalDirectory` for why.
"""

from hubpool_core import hookimpl
from hubpool_portal.directory import PortalDirectory

__all__ = ["PortalDirectory"]


@hookimpl
def hubpool_register_directories(register):
    """Register the Portal device-registry directory."""
    register(PortalDirectory)
