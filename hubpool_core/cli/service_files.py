"""What `hubpool service install` writes: the systemd unit, its environment file, the launchd
agent, and the `tailscale serve` line. Pure functions of a ServiceSpec, so the tests can
snapshot them and `systemd-analyze verify` the unit without touching the machine.

The unit is sandboxed the way systemd recommends for a network daemon that writes only its
own state: the whole file system read-only (ProtectSystem=strict) except the data directory,
no privilege gain (NoNewPrivileges), its own /tmp, no kernel knobs. The node needs nothing
more: it listens on a loopback port, talks to engines and peers over TCP, and writes only
under its data directory.
"""

from __future__ import annotations

import os
import plistlib
import shlex
from dataclasses import dataclass, field
from pathlib import Path

# the publish line lives beside the listen-address mapping it shares with doctor's C2 fix
from hubpool_core.config import tailscale_serve_line  # noqa: F401 - re-exported for the service commands

UNIT_NAME = "hubpool.service"
LAUNCHD_LABEL = "dev.hubpool.node"
#: the system unit's StateDirectory=; systemd creates /var/lib/hubpool (user units: ~/.local/state/hubpool)
STATE_DIRECTORY = "hubpool"


@dataclass(frozen=True)
class ServiceSpec:
    """Where and how the service runs. ``user`` is the per-user unit / LaunchAgent; otherwise the
    system unit / LaunchDaemon, which runs as ``run_as``."""

    executable: Path
    data_dir: Path
    env_file: Path
    listen: str = "127.0.0.1:5002"
    user: bool = False
    run_as: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    #: (variable, default URL, product) of each installed engine plugin, offered commented out
    #: in a new environment file (the core names no engine: the plugins say what they read)
    engines: tuple[tuple[str, str, str], ...] = ()

    @property
    def state_dir_default(self) -> bool:
        """True when the data directory is the unit's StateDirectory= (systemd owns its creation)."""
        return self.data_dir == default_data_dir(self.user)


def default_data_dir(user: bool, home: Path | None = None) -> Path:
    """The data directory a service uses unless told otherwise: systemd's state directory
    (/var/lib/hubpool for the system unit, $XDG_STATE_HOME/hubpool for a user unit)."""
    if not user:
        return Path("/var/lib") / STATE_DIRECTORY
    state = os.environ.get("XDG_STATE_HOME") or str((home or Path.home()) / ".local" / "state")
    return Path(state) / STATE_DIRECTORY


def default_env_file(user: bool, home: Path | None = None) -> Path:
    if not user:
        return Path("/etc/hubpool/hubpool.env")
    config = os.environ.get("XDG_CONFIG_HOME") or str((home or Path.home()) / ".config")
    return Path(config) / "hubpool" / "hubpool.env"


def unit_path(user: bool, home: Path | None = None) -> Path:
    if not user:
        return Path("/etc/systemd/system") / UNIT_NAME
    config = os.environ.get("XDG_CONFIG_HOME") or str((home or Path.home()) / ".config")
    return Path(config) / "systemd" / "user" / UNIT_NAME


def plist_path(user: bool, home: Path | None = None) -> Path:
    if not user:
        return Path("/Library/LaunchDaemons") / f"{LAUNCHD_LABEL}.plist"
    return (home or Path.home()) / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"


def environment_file(spec: ServiceSpec) -> str:
    """A new environment file: the two settings the service needs, then the usual ones to edit."""
    lines = [
        "# The hubpool node's environment, read by its service at each start",
        "# (systemd EnvironmentFile=; on macOS `hubpool service install` copies it into the agent).",
        "# Edit, then restart: systemctl" + (" --user" if spec.user else "") + " restart hubpool",
        f"HUB_POOL_DATA_DIR={spec.data_dir}",
        f"HUB_POOL_LISTEN={spec.listen}",
        *(f"{k}={v}" for k, v in sorted(spec.extra_env.items())),
        "",
        "# The engines on this machine: uncomment the ones that run here (see docs/engines.md).",
        "# Each is probed at its usual address when unset; an engine that is not there is skipped.",
        # the product on its own line: systemd reads no comment after a value
        *(line for var, url, product in spec.engines for line in (f"# {product}", f"#{var}={url}")),
        "",
        "# GPU pressure from a file a timer writes (docs/gpu-pressure.md):",
        f"#HUB_POOL_PRESSURE_HOST_FILE={spec.data_dir / 'gpu_pressure.json'}",
        "",
    ]
    return "\n".join(lines)


def parse_environment_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines as systemd reads them (comments and blank lines skipped, one level of
    surrounding quotes removed)."""
    env: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key.strip()] = value
    return env


def systemd_unit(spec: ServiceSpec) -> str:
    """The unit file. ExecStart is the absolute path of this installation's `hubpool`, so the
    unit runs the same version the operator installed, from a venv or `uv tool`."""
    writable = [] if spec.state_dir_default else [f"ReadWritePaths={_systemd_path(spec.data_dir)}"]
    who = [] if spec.user or not spec.run_as else [f"User={spec.run_as}"]
    wanted = "default.target" if spec.user else "multi-user.target"
    lines = [
        "# Written by `hubpool service install`; `hubpool service uninstall` removes it.",
        "# A new box from nothing to paired: docs/deploy.md in hubpool's source.",
        "[Unit]",
        "Description=hubpool node: pools this machine's LLM engines with the tailnet",
        "Wants=network-online.target",
        "After=network-online.target" + ("" if spec.user else " tailscaled.service"),
        "",
        "[Service]",
        "Type=exec",
        *who,
        # '-': a missing file is not an error (every setting has a default)
        f"EnvironmentFile=-{_systemd_path(spec.env_file, quoted=False)}",
        f"ExecStart={_systemd_path(spec.executable)} serve",
        "Restart=on-failure",
        "RestartSec=5s",
        # a node drains in-flight answers on SIGTERM; give it the time it needs, then stop
        "TimeoutStopSec=30s",
        f"StateDirectory={STATE_DIRECTORY}",
        "StateDirectoryMode=0700",
        # the plugin host caches its entry-point scan under $XDG_CACHE_HOME; home is read-only here
        f"CacheDirectory={STATE_DIRECTORY}",
        f"Environment=XDG_CACHE_HOME=%C/{STATE_DIRECTORY}",
        "UMask=0077",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        # a system service reads its home (a `uv tool` install lives there) but writes none of it
        *([] if spec.user else ["ProtectHome=read-only"]),
        *writable,
        "PrivateTmp=yes",
        "PrivateDevices=no",  # the GPU-pressure sources read /sys/class/drm and /dev stays visible
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectControlGroups=yes",
        "RestrictSUIDSGID=yes",
        "RestrictRealtime=yes",
        "LockPersonality=yes",
        "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
        "",
        "[Install]",
        f"WantedBy={wanted}",
        "",
    ]
    return "\n".join(lines)


def _systemd_path(path: Path, quoted: bool = True) -> str:
    """A path as a unit file spells it: systemd reads %-specifiers, so a literal % is doubled.
    ExecStart= and ReadWritePaths= split on spaces and take quotes; EnvironmentFile= takes the
    rest of the line as the path and no quotes at all (a quoted one is "not absolute, ignoring",
    and the service then starts without its environment)."""
    text = str(path).replace("%", "%%")
    return shlex.quote(text) if quoted and " " in text else text


#: the plist's mode: launchd reads no environment file, so the plist holds the environment file's
#: values (the operator key, the Tailscale OAuth secret) and is as private as that file
PLIST_MODE = 0o600


def launchd_plist(spec: ServiceSpec, environment: dict[str, str]) -> bytes:
    """The launchd agent (per user) or daemon: launchd reads no environment file, so the file's
    variables are copied in (the plist is written :data:`PLIST_MODE`); KeepAlive restarts the
    node when it exits with a failure."""
    doc: dict[str, object] = {
        "Label": LAUNCHD_LABEL,
        "ProgramArguments": [str(spec.executable), "serve"],
        "EnvironmentVariables": environment,
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},
        "ThrottleInterval": 5,
        "StandardOutPath": str(spec.data_dir / "hubpool.log"),
        "StandardErrorPath": str(spec.data_dir / "hubpool.log"),
        "WorkingDirectory": str(spec.data_dir),
        "ProcessType": "Standard",
    }
    if not spec.user and spec.run_as:
        doc["UserName"] = spec.run_as
    return plistlib.dumps(doc, sort_keys=False)


def installed_data_dirs(home: Path | None = None) -> list[tuple[Path, Path, str | None]]:
    """(data directory, the file that says so, the account it runs as) of each hubpool service
    installed on this machine: the system's and this user's, systemd's and launchd's.

    The environment file's HUB_POOL_DATA_DIR wins when it can be read (the system's is 0600,
    root's); otherwise the unit's ReadWritePaths= (or its StateDirectory=, the default), the
    plist's WorkingDirectory when it can be read."""
    found: list[tuple[Path, Path, str | None]] = []
    for user in (False, True):
        unit = unit_path(user, home)
        if unit.is_file():
            data_dir, run_as = _unit_data_dir(unit, user, home)
            found.append((data_dir, unit, run_as))
        plist = plist_path(user, home)
        if plist.is_file():
            try:
                doc = plistlib.loads(plist.read_bytes())
            except (OSError, ValueError, plistlib.InvalidFileException):
                doc = {}
            where = (doc.get("EnvironmentVariables") or {}).get("HUB_POOL_DATA_DIR") or doc.get("WorkingDirectory")
            found.append((Path(where) if where else default_data_dir(user, home), plist,
                          None if user else doc.get("UserName")))
    return found


def _unit_data_dir(unit: Path, user: bool, home: Path | None) -> tuple[Path, str | None]:
    data_dir, run_as, env_file = default_data_dir(user, home), None, None
    try:
        lines = unit.read_text().splitlines()
    except OSError:
        return data_dir, run_as
    for line in lines:
        key, _, value = line.partition("=")
        if key == "ReadWritePaths" and value:
            data_dir = Path(shlex.split(value.replace("%%", "%"))[0])
        elif key == "User":
            run_as = value.strip() or None
        elif key == "EnvironmentFile":
            env_file = Path(value.removeprefix("-").replace("%%", "%"))
    if env_file is not None:
        try:
            named = parse_environment_file(env_file.read_text()).get("HUB_POOL_DATA_DIR")
        except OSError:  # root's 0600 file, read by another account: the unit's own lines decide
            named = None
        if named:
            data_dir = Path(named)
    return data_dir, run_as
