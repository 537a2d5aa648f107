"""The directory contract: sources that name unpaired pairing candidates.

A directory plugin registers :class:`Directory` subclasses through
``hubpool_register_directories``. The core instantiates each once with the node's
environment settings and asks it for candidates when an operator opens discovery;
it never asks on a timer (each candidate is probed over HTTPS afterwards).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True)
class DirectoryCandidate:
    """A device a directory names.

    ``node_fqdn`` is the device's tailnet name as the directory spells it (the core
    normalises it). ``os`` and ``online`` are display-only chips; ``None`` means the
    directory does not report them, never "offline". ``device_id`` is the directory's
    own id, ``""`` when it has none. ``source`` is the directory's ``name``.
    """

    node_fqdn: str
    hostname: str
    source: str
    device_id: str = ""
    os: str | None = None
    online: bool | None = None


@dataclass(frozen=True)
class TailnetStatus:
    """This node's place on the tailnet.

    ``connected`` is whether the tailnet is up here. ``self_fqdn`` is this node's
    MagicDNS name (``None``: no name, MagicDNS off). ``suffix`` is the tailnet's
    MagicDNS suffix such as ``example-tailnet.ts.net`` (``None``: unknown; a node with
    no suffix has nothing to check pairing names against). ``serving`` is whether
    ``tailscale serve`` publishes this node (``None``: cannot tell); ``serve_detail`` is a
    sentence saying what the serve configuration does publish when that is not this node.
    ``error`` is a sentence for the operator when the status could not be read.

    What a daemon's status says beyond that, each ``None`` when the directory cannot tell:
    ``https_certs`` whether the tailnet issues this node an HTTPS certificate for
    ``self_fqdn`` (peers dial ``https://<name>``, which needs one); ``online`` whether the
    coordination server sees this node online; ``backend_state`` the daemon's own word for
    its state (``Running``, ``Stopped``, ``NeedsLogin``...); ``tailnet_name`` the tailnet's
    name (what the Tailscale Admin API is asked about, never the credential's default).
    """

    connected: bool
    self_fqdn: str | None = None
    suffix: str | None = None
    serving: bool | None = None
    error: str | None = None
    https_certs: bool | None = None
    online: bool | None = None
    backend_state: str | None = None
    tailnet_name: str | None = None
    serve_detail: str | None = None


class Directory(ABC):
    """A source of pairing candidates.

    ``name`` is the plugin-visible name (``tailscale_daemon``). A directory that needs a
    credential it does not have must report ``configured() is False`` and make no
    network call at all: a node with no tailnet and no credentials makes zero calls
    when asked for discoverable peers.
    """

    name: ClassVar[str]
    #: True for a directory that names devices by their tailnet (MagicDNS) name: its entries
    #: win a merge (their name is the one the transport dials), carry no ``source`` on the
    #: wire, and it is consulted only while this node is on a tailnet.
    is_tailnet: ClassVar[bool] = False

    def __init__(self, env: Any) -> None:
        self.env = env
        #: set by the core once directories are built: this node's tailnet status as the
        #: directories that can say report it. A directory querying a remote API for "this
        #: tailnet" asks it which tailnet that is (``None`` when used outside a node).
        self.local_tailnet: Callable[[], Awaitable[TailnetStatus]] | None = None

    def configured(self) -> bool:
        """Whether this directory can answer here (its credential or command exists)."""
        return True

    @abstractmethod
    async def candidates(self) -> list[DirectoryCandidate]:
        """Every device this directory names, paired or not, this node included or not;
        the core filters. An empty list means none; errors are logged at debug and
        answered as ``[]`` (a directory that is down never breaks discovery)."""

    async def tailnet_status(self) -> TailnetStatus | None:
        """This node's tailnet status, or ``None`` when this directory is not the
        tailnet's own daemon and cannot say."""
        return None

    def problem(self) -> str | None:
        """Why this directory's last call failed, a sentence for ``hubpool doctor`` (shown
        as a warning); ``None`` when it last answered, or has not been asked. Default:
        ``None``."""
        return None

    async def members(self) -> set[str] | None:
        """The tailnet's device names for the pairing membership check, or ``None`` when
        this directory cannot enumerate the tailnet (the check then relies on the
        MagicDNS suffix alone). Raises nothing: an unreachable API answers ``None``."""
        return None
