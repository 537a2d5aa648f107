"""`hubpool service install|uninstall|status`: run the node at boot, restarted on failure.

Linux gets a systemd unit (the system's, running as a named user, or `--user`'s own), with an
environment file beside it; macOS gets a launchd daemon or agent. What is written comes from
hubpool_core.cli.service_files; this module decides where, asks systemctl/launchctl to load
it, and says what it did. `--dry-run` prints every file and command instead.
"""

from __future__ import annotations

import getpass
import json
import os
import shlex
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import typer

from hubpool_core.cli import service_files as sf
from hubpool_core.cli.commands import _fail, app, err
from hubpool_core.config import DEFAULT_PORT, local_base_url

service_app = typer.Typer(help="Run the node as a service: started at boot, restarted on failure "
                               "(systemd on Linux, launchd on macOS).", no_args_is_help=True)
app.add_typer(service_app, name="service")

UserOption = typer.Option(False, "--user", help="A per-user service (systemd --user / a LaunchAgent) "
                                                "instead of the system's.")
DryRunOption = typer.Option(False, "--dry-run", help="Print what would be written and run; change nothing.")
RootOption = typer.Option(None, "--root", help="Write under this directory instead of / and load nothing "
                                               "(building an image); implies --no-start.")
PlatformOption = typer.Option(None, "--platform", help="linux or macos (default: this machine's).", hidden=True)


@dataclass
class Plan:
    """Files to write (path -> content), the data directory to create (and the account that
    must own it: None is whoever runs the install), and commands to run, in order."""

    files: list[tuple[Path, bytes, int]]
    kept: list[Path]
    commands: list[list[str]]
    dirs: list[tuple[Path, str | None]] = field(default_factory=list)


def _platform(override: str | None) -> str:
    name = override or {"linux": "linux", "darwin": "macos"}.get(sys.platform, sys.platform)
    if name not in ("linux", "macos"):
        _fail(f"`hubpool service` knows systemd (Linux) and launchd (macOS), not {name!r}; "
              "run `hubpool serve` under this system's own service manager")
    return name


def _rooted(root: Path | None, path: Path) -> Path:
    return root / path.relative_to(path.anchor) if root else path


def _executable(given: Path | None) -> Path:
    """The `hubpool` of this installation (a venv or `uv tool`), never a bare name on PATH: the
    service must run the version the operator just installed."""
    if given is not None:
        path = given.expanduser().absolute()
    else:
        beside = Path(sys.executable).parent / "hubpool"
        found = shutil.which("hubpool")
        path = beside if beside.exists() else Path(found).absolute() if found else beside
    if not path.exists():
        _fail(f"cannot find the hubpool command at {path}; name it with --exec /path/to/hubpool")
    return path


def _systemctl(user: bool, *args: str) -> list[str]:
    return ["systemctl", *(["--user"] if user else []), *args]


def _launchctl_domain(user: bool) -> str:
    return f"gui/{os.getuid()}" if user else "system"


@service_app.command("install")
def install(
    user: bool = UserOption,
    dry_run: bool = DryRunOption,
    data_dir: Path | None = typer.Option(None, "--data-dir", help="The node's data directory (default: the "
                                         "service's state directory, /var/lib/hubpool or ~/.local/state/hubpool)."),
    listen: str = typer.Option(f"127.0.0.1:{DEFAULT_PORT}", "--listen", help="host:port the node listens on; "
                               "`tailscale serve` publishes it on the tailnet."),
    env_file: Path | None = typer.Option(None, "--env-file", help="The environment file the service reads "
                                         "(default /etc/hubpool/hubpool.env, or ~/.config/hubpool/hubpool.env "
                                         "with --user). An existing file is kept as it is."),
    run_as: str | None = typer.Option(None, "--run-as", help="The account a system service runs as (default: "
                                      "the user who ran sudo, else the current user)."),
    executable: Path | None = typer.Option(None, "--exec", help="The hubpool command to run (default: the one "
                                           "running now)."),
    start: bool = typer.Option(True, "--start/--no-start", help="Enable and start it now."),
    root: Path | None = RootOption,
    platform: str | None = PlatformOption,
) -> None:
    """Install the node as a service that starts at boot and restarts on failure."""
    system = _platform(platform)
    spec = sf.ServiceSpec(
        executable=_executable(executable),
        data_dir=(data_dir.expanduser().absolute() if data_dir else sf.default_data_dir(user)),
        env_file=(env_file.expanduser().absolute() if env_file else sf.default_env_file(user)),
        listen=listen, user=user,
        run_as=None if user else (run_as or os.environ.get("SUDO_USER") or getpass.getuser()),
        engines=_installed_engines(),
    )
    if not user and spec.run_as == "root":
        err.print("note: the service will run as root; a dedicated account is safer (--run-as NAME)")
    plan = _install_plan(spec, system, root, start)
    if dry_run:
        _print_plan(plan, "would")
    else:
        if root is None and not user and os.geteuid() != 0:
            _fail("a system service writes under /etc and needs root: run it with sudo, or add --user "
                  "for a service of your own (see docs/deploy.md)")
        _apply(plan)
    _print_next_steps(spec, system, root is not None or not start)


def _installed_engines() -> tuple[tuple[str, str, str], ...]:
    from hubpool_core.plugins import load_plugins

    try:
        host = load_plugins()
    except Exception:  # noqa: BLE001 - the template's engine lines are a convenience, never a reason to fail
        return ()
    return tuple((e.env_var, e.default_url, getattr(e, "product", e.kind)) for e in host.engines)


def _install_plan(spec: sf.ServiceSpec, system: str, root: Path | None, start: bool) -> Plan:
    env_path = _rooted(root, spec.env_file)
    files: list[tuple[Path, bytes, int]] = []
    kept: list[Path] = []
    if env_path.exists():
        kept.append(env_path)  # the operator's edits win over a fresh template
        environment = sf.parse_environment_file(env_path.read_text())
    else:
        text = sf.environment_file(spec)
        files.append((env_path, text.encode(), 0o600))  # it may hold API secrets (Tailscale OAuth)
        environment = sf.parse_environment_file(text)
    commands: list[list[str]] = []
    dirs: list[tuple[Path, str | None]] = []
    # the data directory must exist, owned by the account the node runs as, before the service
    # starts: systemd sets up ReadWritePaths= (and launchd the WorkingDirectory) only for a path
    # that is there. systemd creates its own StateDirectory=, the default.
    if system == "macos" or not spec.state_dir_default:
        dirs.append((_rooted(root, spec.data_dir), None if spec.user else spec.run_as))
    if system == "linux":
        files.append((_rooted(root, sf.unit_path(spec.user)), sf.systemd_unit(spec).encode(), 0o644))
        if root is None:
            commands.append(_systemctl(spec.user, "daemon-reload"))
            commands.append(_systemctl(spec.user, "enable", *(["--now"] if start else []), sf.UNIT_NAME))
    else:
        plist = _rooted(root, sf.plist_path(spec.user))
        files.append((plist, sf.launchd_plist(spec, environment), sf.PLIST_MODE))
        if root is None and start:
            commands.append(["launchctl", "bootstrap", _launchctl_domain(spec.user), str(plist)])
    return Plan(files, kept, commands, dirs)


def _print_plan(plan: Plan, verb: str) -> None:
    for path in plan.kept:
        print(f"# {verb} keep {path} (it exists; your edits stay)")
    for path, owner in plan.dirs:
        print(f"# {verb} create the data directory {path} (mode 700{f', owned by {owner}' if owner else ''})")
    for path, content, mode in plan.files:
        print(f"# {verb} write {path} (mode {mode:o}):")
        print(content.decode().rstrip("\n"))
        print()
    for cmd in plan.commands:
        print(f"# {verb} run: {shlex.join(cmd)}")


def _apply(plan: Plan) -> None:
    for path, owner in plan.dirs:
        _data_directory(path, owner)
    for path, content, mode in plan.files:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.unlink(missing_ok=True)
            # created with its mode: a plist holding the env file's secrets is never readable by
            # others, not even between the write and a chmod
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            with os.fdopen(fd, "wb") as fh:
                fh.write(content)
                os.fchmod(fh.fileno(), mode)  # exactly this mode, whatever the umask
            tmp.replace(path)  # a half-written unit is never what systemd reads
        except OSError as exc:
            _fail(f"cannot write {path}: {exc.strerror or exc}")
        err.print(f"wrote {path}")
    for path in plan.kept:
        err.print(f"kept {path} as it is")
    for cmd in plan.commands:
        _run(cmd)


def _data_directory(path: Path, owner: str | None) -> None:
    """Create the node's data directory (mode 0700) owned by ``owner``, the account the service
    runs as; when that cannot be done here, say the command that does it."""
    existed = path.is_dir()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        _fail(f"cannot create the data directory {path}: {exc.strerror or exc}")
    import pwd  # POSIX only, as the service managers this command knows

    quoted = shlex.quote(str(path))
    if owner is None:
        err.print(f"{'kept' if existed else 'created'} the data directory {path}")
        return
    try:
        account = pwd.getpwnam(owner)
    except KeyError:
        account = None
    if existed:
        if account is not None and path.stat().st_uid == account.pw_uid:
            err.print(f"kept the data directory {path} (owned by {owner})")
        else:  # an existing directory's contents are the operator's: never chowned behind their back
            err.print(f"note: {path} exists but is not owned by {owner}, who the service runs as; it cannot write "
                      f"there until you run: sudo chown -R {shlex.quote(owner)}: {quoted}")
        return
    try:
        if account is None:
            raise LookupError(f"no account named {owner} on this machine")
        os.chown(path, account.pw_uid, account.pw_gid)
    except (LookupError, OSError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        err.print(f"note: created {path}, but could not give it to {owner} ({why}); before the service starts, "
                  f"run: sudo chown {shlex.quote(owner)}: {quoted}")
        return
    err.print(f"created the data directory {path} (mode 700, owned by {owner})")


def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess[str] | None:
    if shutil.which(cmd[0]) is None:
        if check:
            _fail(f"`{cmd[0]}` is not on PATH; the files are written, so run `{' '.join(cmd)}` where it is")
        return None
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        _fail(f"`{' '.join(cmd)}` failed ({r.returncode}): {(r.stderr or r.stdout).strip()}")
    return r


def _print_next_steps(spec: sf.ServiceSpec, system: str, not_started: bool) -> None:
    ctl = "systemctl" + (" --user" if spec.user else "")
    print()
    if not_started:
        print("Start it:" if system == "linux" else "Load it:")
        print(f"  {ctl} enable --now hubpool" if system == "linux"
              else f"  launchctl bootstrap {_launchctl_domain(spec.user)} {shlex.quote(str(sf.plist_path(spec.user)))}")
    print("Publish it on the tailnet (once; Linux needs root or `sudo tailscale set --operator=$USER`):")
    print(f"  {sf.tailscale_serve_line(spec.listen)}")
    print(f"The node keeps its data in {spec.data_dir}. For `hubpool status` and the other commands here:")
    # quoted for a shell: a data directory may hold a space
    print(f"  export HUB_POOL_DATA_DIR={shlex.quote(str(spec.data_dir))} HUB_POOL_LISTEN={shlex.quote(spec.listen)}")
    if spec.user and system == "linux":
        print("A --user service stops at logout unless lingering is on: loginctl enable-linger $USER")


@service_app.command("uninstall")
def uninstall(
    user: bool = UserOption,
    dry_run: bool = DryRunOption,
    root: Path | None = RootOption,
    platform: str | None = PlatformOption,
) -> None:
    """Stop the service and remove it. The environment file and the data directory stay."""
    system = _platform(platform)
    commands: list[list[str]] = []
    if system == "linux":
        path = _rooted(root, sf.unit_path(user))
        if root is None:
            commands.append(_systemctl(user, "disable", "--now", sf.UNIT_NAME))
    else:
        path = _rooted(root, sf.plist_path(user))
        if root is None:
            commands.append(["launchctl", "bootout", f"{_launchctl_domain(user)}/{sf.LAUNCHD_LABEL}"])
    if dry_run:
        for cmd in commands:
            print(f"# would run: {' '.join(cmd)}")
        print(f"# would remove {path}")
        return
    if root is None and not user and os.geteuid() != 0:
        _fail("removing a system service needs root: run it with sudo (or --user for your own)")
    if not path.exists():
        _fail(f"no hubpool service is installed here ({path} does not exist)")
    for cmd in commands:
        _run(cmd, check=False)  # already stopped or never loaded is fine: removing is the point
    path.unlink()
    err.print(f"removed {path}")
    if system == "linux" and root is None:
        _run(_systemctl(user, "daemon-reload"), check=False)
    err.print(f"kept {sf.default_env_file(user)} and the data directory (delete them to forget this node)")


@service_app.command("status")
def status(
    user: bool = UserOption,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
    root: Path | None = RootOption,
    platform: str | None = PlatformOption,
) -> None:
    """Is the service installed, enabled and running, and does the node answer? Exit 0 when it
    answers, 3 when it does not (as `systemctl status`)."""
    system = _platform(platform)
    path = _rooted(root, sf.unit_path(user) if system == "linux" else sf.plist_path(user))
    env_path = _rooted(root, sf.default_env_file(user))
    environment = sf.parse_environment_file(env_path.read_text()) if env_path.exists() else {}
    listen = environment.get("HUB_POOL_LISTEN", f"127.0.0.1:{DEFAULT_PORT}")
    manager: dict[str, str] = {}
    if root is None:
        if system == "linux":
            for what in ("is-enabled", "is-active"):
                r = _run(_systemctl(user, what, sf.UNIT_NAME), check=False)
                manager[what] = (r.stdout.strip() or r.stderr.strip()) if r else "systemctl not found"
        else:
            r = _run(["launchctl", "print", f"{_launchctl_domain(user)}/{sf.LAUNCHD_LABEL}"], check=False)
            manager["loaded"] = ("yes" if r and r.returncode == 0 else "no") if r else "launchctl not found"
    answers = _node_answers(listen)
    report = {"installed": path.exists(), "file": str(path), "envFile": str(env_path) if env_path.exists() else None,
              "listen": listen, "manager": manager, "answers": answers,
              "publish": sf.tailscale_serve_line(listen)}
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        print(f"service file  {path} ({'installed' if report['installed'] else 'not installed'})")
        print(f"environment   {report['envFile'] or 'none'}")
        for key, value in manager.items():
            print(f"{key:<13} {value}")
        print(f"node          {listen}: {'answers' if answers else 'does not answer'}")
        if answers:
            print(f"publish with  {report['publish']}")
    raise typer.Exit(0 if answers else 3)


def _node_answers(listen: str) -> bool:
    url = local_base_url(listen) + "/api/inference/pool/identify"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=3) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False
