"""hubpool directory plugin: the Tailscale Admin API device list.

Names every device on the tailnet, including ones the local daemon does not list, using
an OAuth client (``TAILSCALE_OAUTH_CLIENT_ID`` / ``TAILSCALE_OAUTH_CLIENT_SECRET``, scope
``devices:core:read``). Without both, it makes no network call at all.
"""

from hubpool_core import hookimpl
from hubpool_tailscale_admin.directory import TailscaleAdminDirectory

__all__ = ["TailscaleAdminDirectory"]


@hookimpl
def hubpool_register_directories(register):
    """Register the Tailscale Admin API directory."""
    register(TailscaleAdminDirectory)
