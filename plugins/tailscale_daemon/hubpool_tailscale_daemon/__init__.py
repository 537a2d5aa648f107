"""hubpool directory plugin: the local Tailscale daemon.

Names every tailnet peer this node can see (``tailscale status --json``'s peer map) with
no credential at all, and reports this node's own tailnet status.
"""

from hubpool_core import hookimpl
from hubpool_tailscale_daemon.directory import TailscaleDaemonDirectory

__all__ = ["TailscaleDaemonDirectory"]


@hookimpl
def hubpool_register_directories(register):
    """Register the local Tailscale daemon directory."""
    register(TailscaleDaemonDirectory)
