"""`hubpool service`: the systemd unit and launchd agent it writes (issue 19, item 2).

The unit's text is held against a snapshot (tests/data/service/; regenerate with
HUBPOOL_UPDATE_SNAPSHOTS=1 after a deliberate change, and read the diff), and every generated
unit goes through `systemd-analyze verify`, which Debian's `systemd` package provides (.ci/run
installs it). verify exits 0 on unknown keys and bad values and only warns, so the tests hold
its output to nothing at all, and first prove on a broken unit that it does complain.
"""

from __future__ import annotations

import dataclasses
import os
import plistlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hubpool_core.cli import service_files as sf
from hubpool_core.cli.commands import app

SNAPSHOTS = Path(__file__).parent / "data" / "service"
HUBPOOL = Path(sys.executable).parent / "hubpool"  # the dev environment's own console script
ENGINES = (("EXAMPLE_URL", "http://127.0.0.1:9999", "Example Engine"),)
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None,
    reason="systemd-analyze is missing: Debian's `systemd` package provides it (apt-get install systemd; .ci/run does)")


def system_spec(**kw) -> sf.ServiceSpec:
    return sf.ServiceSpec(executable=Path("/opt/hubpool/bin/hubpool"), data_dir=sf.default_data_dir(False),
                          env_file=sf.default_env_file(False), run_as="hubpool", engines=ENGINES, **kw)


def user_spec(home: Path, **kw) -> sf.ServiceSpec:
    return sf.ServiceSpec(executable=Path("/home/ada/.local/bin/hubpool"), data_dir=home / ".local/state/hubpool",
                          env_file=home / ".config/hubpool/hubpool.env", user=True, engines=ENGINES, **kw)


def check_snapshot(name: str, text: str) -> None:
    path = SNAPSHOTS / name
    if os.environ.get("HUBPOOL_UPDATE_SNAPSHOTS") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no snapshot {path}; run with HUBPOOL_UPDATE_SNAPSHOTS=1 once and review it"
    assert text == path.read_text(), f"{name} changed; if deliberate, HUBPOOL_UPDATE_SNAPSHOTS=1 and review the diff"


def hubpool(*args: str, env: dict | None = None):
    """The command in this process (typer's runner): each call is milliseconds, not a new interpreter.
    The result has .returncode, .stdout and .stderr like a finished subprocess."""
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200", **(env or {})}, catch_exceptions=False)
    result.returncode = result.exit_code
    return result


def verify(unit: Path, user: bool, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ}
    if user:  # a user manager needs its runtime directory, which a CI container has no session for
        runtime = tmp_path / "runtime"
        runtime.mkdir(mode=0o700, exist_ok=True)
        env["XDG_RUNTIME_DIR"] = str(runtime)
    cmd = [SYSTEMD_ANALYZE, *(["--user"] if user else []), "verify", str(unit)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)


# -- what it writes -------------------------------------------------------------------------

def test_system_unit_matches_snapshot_and_is_sandboxed():
    unit = sf.systemd_unit(system_spec())
    check_snapshot("hubpool.service", unit)
    lines = unit.splitlines()
    for line in ("EnvironmentFile=-/etc/hubpool/hubpool.env", "ExecStart=/opt/hubpool/bin/hubpool serve",
                 "Restart=on-failure", "ProtectSystem=strict", "NoNewPrivileges=yes", "StateDirectory=hubpool",
                 "User=hubpool", "WantedBy=multi-user.target"):
        assert line in lines
    # the data directory is the state directory here, so nothing else is writable
    assert not any(line.startswith("ReadWritePaths=") for line in lines)


def test_user_unit_matches_snapshot(tmp_path):
    unit = sf.systemd_unit(user_spec(Path("/home/ada")))
    check_snapshot("hubpool-user.service", unit)
    assert "WantedBy=default.target" in unit.splitlines()
    assert "User=" not in unit  # a user manager runs it as its own user


def test_a_data_dir_elsewhere_is_the_one_writable_path():
    unit = sf.systemd_unit(dataclasses.replace(system_spec(), data_dir=Path("/srv/hub pool")))
    assert "ReadWritePaths='/srv/hub pool'" in unit.splitlines()


def test_environment_file_matches_snapshot_and_parses_as_systemd_reads_it():
    text = sf.environment_file(system_spec())
    check_snapshot("hubpool.env", text)
    env = sf.parse_environment_file(text)
    assert env == {"HUB_POOL_DATA_DIR": "/var/lib/hubpool", "HUB_POOL_LISTEN": "127.0.0.1:5002"}
    # uncommenting an engine line gives a clean value (no trailing comment systemd would keep)
    uncommented = text.replace("#EXAMPLE_URL=", "EXAMPLE_URL=")
    assert sf.parse_environment_file(uncommented)["EXAMPLE_URL"] == "http://127.0.0.1:9999"


def test_launchd_agent_matches_snapshot_and_restarts_on_failure():
    spec = user_spec(Path("/Users/ada"))
    raw = sf.launchd_plist(spec, {"HUB_POOL_DATA_DIR": str(spec.data_dir), "HUB_POOL_LISTEN": "127.0.0.1:5002"})
    check_snapshot("dev.hubpool.node.plist", raw.decode())
    doc = plistlib.loads(raw)
    assert doc["ProgramArguments"] == ["/home/ada/.local/bin/hubpool", "serve"]
    assert doc["KeepAlive"] == {"SuccessfulExit": False} and doc["RunAtLoad"] is True
    assert doc["EnvironmentVariables"]["HUB_POOL_LISTEN"] == "127.0.0.1:5002"


@pytest.mark.parametrize(("listen", "line"), [
    ("127.0.0.1:5002", "tailscale serve --bg --https=443 http://127.0.0.1:5002"),
    ("0.0.0.0:6000", "tailscale serve --bg --https=443 http://127.0.0.1:6000"),
    ("[::1]:5003", "tailscale serve --bg --https=443 http://[::1]:5003"),
])
def test_tailscale_serve_line(listen, line):
    assert sf.tailscale_serve_line(listen) == line


# -- systemd-analyze verify -------------------------------------------------------------------

@needs_systemd
def test_verify_complains_about_a_broken_unit(tmp_path):
    """The check below is only worth something if verify speaks up: a bad key and a missing binary."""
    bad = sf.systemd_unit(system_spec()).replace("Restart=on-failure", "Restart=on-failure\nProtectSystem=strictish")
    path = tmp_path / "hubpool.service"
    path.write_text(bad.replace("ExecStart=/opt/hubpool/bin/hubpool", f"ExecStart={HUBPOOL}"))
    r = verify(path, False, tmp_path)
    assert "strictish" in r.stderr
    path.write_text(sf.systemd_unit(system_spec()))  # /opt/hubpool/bin/hubpool does not exist here
    r = verify(path, False, tmp_path)
    assert r.returncode != 0 and "not executable" in r.stderr


@needs_systemd
@pytest.mark.parametrize("user", [False, True], ids=["system", "user"])
def test_generated_unit_passes_systemd_analyze_verify(tmp_path, user):
    root = tmp_path / "root"
    args = ["service", "install", "--root", str(root), "--exec", str(HUBPOOL)]
    env = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": "", "XDG_STATE_HOME": ""}
    r = hubpool(*args, *(["--user"] if user else ["--run-as", "root"]), env=env)
    assert r.returncode == 0, r.stderr
    units = list(root.rglob("hubpool.service"))
    assert len(units) == 1, list(root.rglob("*"))
    r = verify(units[0], user, tmp_path)
    assert r.returncode == 0 and r.stderr == "" and r.stdout == "", (r.returncode, r.stdout, r.stderr)


# -- the command --------------------------------------------------------------------------------

def test_install_dry_run_prints_everything_and_writes_nothing(tmp_path):
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": "", "XDG_STATE_HOME": ""}
    r = hubpool("service", "install", "--user", "--dry-run", "--exec", str(HUBPOOL), "--platform", "linux", env=env)
    assert r.returncode == 0, r.stderr
    unit_path = tmp_path / ".config/systemd/user/hubpool.service"
    assert f"# would write {unit_path} (mode 644):" in r.stdout
    assert f"# would write {tmp_path / '.config/hubpool/hubpool.env'} (mode 600):" in r.stdout
    assert f"ExecStart={HUBPOOL} serve" in r.stdout and "ProtectSystem=strict" in r.stdout
    assert "# would run: systemctl --user enable --now hubpool.service" in r.stdout
    assert "tailscale serve --bg --https=443 http://127.0.0.1:5002" in r.stdout
    # the engine lines come from the installed plugins, not from the core
    assert "#OLLAMA_URL=http://127.0.0.1:11434" in r.stdout
    # (stevedore caches the entry-point scan under ~/.cache: that is not the service's doing)
    written = [p for p in tmp_path.rglob("*") if p.parts[len(tmp_path.parts)] != ".cache"]
    assert not written, f"a dry run wrote files: {written}"


def test_install_into_a_root_keeps_an_edited_env_file_and_uninstall_removes_the_unit(tmp_path):
    root = tmp_path / "img"
    env_file = root / "etc/hubpool/hubpool.env"
    env_file.parent.mkdir(parents=True)
    env_file.write_text("HUB_POOL_LISTEN=127.0.0.1:5100\nOLLAMA_URL=http://gpu:11434\n")
    r = hubpool("service", "install", "--root", str(root), "--exec", str(HUBPOOL), "--run-as", "ada",
                "--platform", "linux")
    assert r.returncode == 0, r.stderr
    assert env_file.read_text() == "HUB_POOL_LISTEN=127.0.0.1:5100\nOLLAMA_URL=http://gpu:11434\n"
    assert f"kept {env_file}" in r.stderr
    unit = (root / "etc/systemd/system/hubpool.service")
    assert "User=ada" in unit.read_text().splitlines()
    assert "systemctl enable --now hubpool" in r.stdout  # not started: --root loads nothing
    r = hubpool("service", "status", "--root", str(root), "--json", "--platform", "linux")
    assert r.returncode == 3  # installed, but nothing answers on 127.0.0.1:5100
    assert '"installed": true' in r.stdout and '"listen": "127.0.0.1:5100"' in r.stdout
    r = hubpool("service", "uninstall", "--root", str(root), "--platform", "linux")
    assert r.returncode == 0, r.stderr
    assert not unit.exists() and env_file.exists()
    r = hubpool("service", "uninstall", "--root", str(root), "--platform", "linux")
    assert r.returncode == 1 and "no hubpool service is installed" in r.stderr


def test_macos_install_writes_a_launch_agent_with_the_env_file_copied_in(tmp_path):
    env = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": "", "XDG_STATE_HOME": ""}
    root = tmp_path / "img"
    r = hubpool("service", "install", "--user", "--root", str(root), "--exec", str(HUBPOOL), "--platform", "macos",
                "--listen", "127.0.0.1:5010", env=env)
    assert r.returncode == 0, r.stderr
    (plist,) = root.rglob("dev.hubpool.node.plist")
    assert plist.parent.name == "LaunchAgents"
    doc = plistlib.loads(plist.read_bytes())
    assert doc["EnvironmentVariables"]["HUB_POOL_LISTEN"] == "127.0.0.1:5010"
    assert "launchctl bootstrap gui/" in r.stdout
    assert "tailscale serve --bg --https=443 http://127.0.0.1:5010" in r.stdout


def test_a_system_install_without_root_says_how(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # an ordinary account, whoever runs the tests
    r = hubpool("service", "install", "--exec", str(HUBPOOL), "--platform", "linux")
    assert r.returncode == 1 and "sudo" in r.stderr and "--user" in r.stderr


# -- issue 26: the launchd plist's secrets (item 6), paths with a space and the data directory (23)

SECRETS = "TAILSCALE_OAUTH_CLIENT_SECRET=tskey-client-s3cret\nHUB_POOL_OPERATOR_KEY=op-s3cret\n"


@pytest.mark.parametrize("user", [True, False], ids=["agent", "daemon"])
def test_the_launchd_plist_holding_the_env_files_secrets_is_readable_by_its_owner_only(tmp_path, user):
    """launchd reads no environment file, so the plist carries its values: on main it was written
    0644 (everyone on the Mac could read the operator key and the Tailscale OAuth secret)."""
    home, root = tmp_path / "home", tmp_path / "img"
    env = {"HOME": str(home), "XDG_CONFIG_HOME": "", "XDG_STATE_HOME": ""}
    env_file = root / (str(home / ".config/hubpool/hubpool.env").lstrip("/") if user else "etc/hubpool/hubpool.env")
    env_file.parent.mkdir(parents=True)
    env_file.write_text(SECRETS)
    env_file.chmod(0o600)
    plist_dir = root / (str(home / "Library/LaunchAgents").lstrip("/") if user else "Library/LaunchDaemons")
    plist_dir.mkdir(parents=True)
    (plist_dir / "dev.hubpool.node.plist").write_bytes(b"an older, world-readable plist")
    (plist_dir / "dev.hubpool.node.plist").chmod(0o644)
    args = ["service", "install", "--root", str(root), "--exec", str(HUBPOOL), "--platform", "macos",
            *(["--user"] if user else ["--run-as", "nobody"])]
    dry = hubpool(*args, "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert f"# would write {plist_dir / 'dev.hubpool.node.plist'} (mode 600):" in dry.stdout
    r = hubpool(*args, env=env)
    assert r.returncode == 0, r.stderr
    plist = plist_dir / "dev.hubpool.node.plist"
    assert oct(plist.stat().st_mode & 0o777) == "0o600"
    doc = plistlib.loads(plist.read_bytes())
    assert doc["EnvironmentVariables"]["TAILSCALE_OAUTH_CLIENT_SECRET"] == "tskey-client-s3cret"
    assert not list(plist_dir.glob("*.tmp"))
    # launchd starts the job in its data directory: it must be there
    data = root / str(Path(doc["WorkingDirectory"])).lstrip("/")
    assert data.is_dir() and oct(data.stat().st_mode & 0o777) == "0o700"


@needs_systemd
def test_paths_with_a_space_give_a_unit_systemd_accepts_and_a_quoted_export_line(tmp_path):
    """On main EnvironmentFile= was quoted, which systemd reads as a relative path and ignores
    ("path is not absolute, ignoring": the node then starts without its environment), and the
    printed export line split the data directory at the space."""
    root = tmp_path / "img"
    bindir = tmp_path / "opt dir" / "bin"
    bindir.mkdir(parents=True)
    (bindir / "hubpool").symlink_to(HUBPOOL)
    r = hubpool("service", "install", "--root", str(root), "--exec", str(bindir / "hubpool"), "--platform", "linux",
                "--run-as", "root", "--env-file", "/etc/hub pool/hubpool.env", "--data-dir", "/srv/hub pool/data")
    assert r.returncode == 0, r.stderr
    unit = root / "etc/systemd/system/hubpool.service"
    lines = unit.read_text().splitlines()
    assert "EnvironmentFile=-/etc/hub pool/hubpool.env" in lines
    assert "ReadWritePaths='/srv/hub pool/data'" in lines
    assert f"ExecStart='{bindir / 'hubpool'}' serve" in lines
    assert (root / "etc/hub pool/hubpool.env").exists()
    done = verify(unit, False, tmp_path)
    assert done.returncode == 0 and done.stderr == "" and done.stdout == "", (done.stdout, done.stderr)
    # the export line, run by a shell, sets the whole path
    (export,) = [line.strip() for line in r.stdout.splitlines() if line.strip().startswith("export ")]
    shell = subprocess.run(["sh", "-c", f'{export}; printf "%s|%s" "$HUB_POOL_DATA_DIR" "$HUB_POOL_LISTEN"'],
                           capture_output=True, text=True, timeout=30)
    assert shell.stdout == "/srv/hub pool/data|127.0.0.1:5002", shell


def test_the_unit_s_data_directory_is_created_for_the_service_account(tmp_path):
    """On main ReadWritePaths= named a directory the install never created: systemd then fails
    the start (226/NAMESPACE). Now it is created, 0700, owned by the account the unit runs as."""
    import pwd

    root = tmp_path / "img"
    args = ["service", "install", "--root", str(root), "--exec", str(HUBPOOL), "--platform", "linux",
            "--data-dir", "/srv/hubpool-data"]
    dry = hubpool(*args, "--run-as", "nobody", "--dry-run")
    assert "# would create the data directory " in dry.stdout and "owned by nobody" in dry.stdout, dry.stdout
    assert not (root / "srv").exists()
    r = hubpool(*args, "--run-as", "nobody")
    assert r.returncode == 0, r.stderr
    data = root / "srv/hubpool-data"
    assert data.is_dir() and oct(data.stat().st_mode & 0o777) == "0o700"
    if os.geteuid() == 0:
        assert data.stat().st_uid == pwd.getpwnam("nobody").pw_uid
        assert "owned by nobody" in r.stderr
    else:  # an ordinary account cannot give it away: the command says what to run instead
        assert f"sudo chown nobody: {data}" in r.stderr, r.stderr
    # an account this machine does not have (an image built elsewhere): the command to run
    r = hubpool("service", "install", "--root", str(tmp_path / "img2"), "--exec", str(HUBPOOL), "--platform",
                "linux", "--data-dir", "/srv/hub pool", "--run-as", "no-such-account-x")
    assert r.returncode == 0, r.stderr
    assert f"run: sudo chown no-such-account-x: '{tmp_path / 'img2' / 'srv/hub pool'}'" in r.stderr, r.stderr
    # a directory that already holds the operator's data is never chowned behind their back
    r = hubpool(*args, "--run-as", "no-such-account-x")
    assert r.returncode == 0 and "sudo chown -R no-such-account-x:" in r.stderr, r.stderr
    if os.geteuid() == 0:
        assert data.stat().st_uid == pwd.getpwnam("nobody").pw_uid
