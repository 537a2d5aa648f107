"""`hubpool api-key create|list|revoke` open the store of the data directory they read (issue 26,
item 22). On main they made a fresh store wherever they looked and printed a key valid on no
node — the likely case after `sudo hubpool service install` put the node's data in
/var/lib/hubpool while the operator's shell still read ~/.local/share/hubpool — and a missing
directory was "cannot reach the database". Now a directory no node uses is refused, naming the
directory read and where the installed service keeps its data. Through running nodes and the
real CLI in its own process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
from harness import RunningNode

from hubpool_core.cli import service_files as sf

P = "/api/inference/pool"


def hubpool(*args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("HUB_POOL_", "XDG_"))}
    environ.update({"COLUMNS": "400", "HUB_POOL_LISTEN": "127.0.0.1:9", **env})
    return subprocess.run([sys.executable, "-m", "hubpool_core.cli", *args], capture_output=True, text=True,
                          env=environ, timeout=60, stdin=subprocess.DEVNULL)


def status_with(node: RunningNode, key: str) -> int:
    return httpx.get(node.url + P + "/status", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                     trust_env=False).status_code


def test_a_key_minted_in_the_running_node_s_data_directory_works_there(tmp_path):
    with RunningNode(tmp_path / "node") as node:
        env = {"HUB_POOL_DATA_DIR": str(tmp_path / "node"), "HUB_POOL_LISTEN": f"127.0.0.1:{node.port}"}
        r = hubpool("api-key", "create", "--scope", "qa:read", "--name", "monitor", **env)
        assert r.returncode == 0, r.stderr
        key = r.stdout.strip()
        assert status_with(node, key) == 200
        assert "monitor" in hubpool("api-key", "list", **env).stdout
        assert hubpool("api-key", "revoke", "monitor", **env).returncode == 0
        assert status_with(node, key) == 401


def test_a_missing_or_empty_data_directory_is_no_node_data_here(tmp_path):
    missing = tmp_path / "nowhere"
    for args in (("api-key", "create", "--scope", "inference"), ("api-key", "list"), ("api-key", "revoke", "x")):
        r = hubpool(*args, HUB_POOL_DATA_DIR=str(missing))
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert f"no node data here: {missing} does not exist, so a key made here would be valid on no node" \
            in r.stderr, r.stderr
        assert "cannot reach the database" not in r.stderr and "Traceback" not in r.stderr
        assert r.stdout == ""  # no key printed
    assert not missing.exists()  # and nothing created
    empty = tmp_path / "empty"
    empty.mkdir()
    r = hubpool("api-key", "create", "--scope", "inference", HUB_POOL_DATA_DIR=str(empty))
    assert r.returncode == 1 and f"no node data here: {empty} holds no hubpool database" in r.stderr, r.stderr
    assert "start a node here first with `hubpool serve`" in r.stderr
    assert list(empty.iterdir()) == []


def test_another_node_s_directory_is_refused_while_this_node_answers(tmp_path):
    RunningNode(tmp_path / "old").start().stop()  # a data directory a node used once, and no longer
    with RunningNode(tmp_path / "node") as node:
        r = hubpool("api-key", "create", "--scope", "inference", HUB_POOL_DATA_DIR=str(tmp_path / "old"),
                    HUB_POOL_LISTEN=f"127.0.0.1:{node.port}")
        assert r.returncode == 1, r.stderr
        assert (f"the node answering at http://127.0.0.1:{node.port} does not use the data directory "
                f"{tmp_path / 'old'}") in r.stderr, r.stderr
        assert r.stdout == ""


def test_the_default_directory_is_refused_while_the_installed_service_keeps_its_data_elsewhere(tmp_path):
    home = tmp_path / "home"
    default = home / ".local" / "share" / "hubpool"  # what the CLI reads with nothing set
    service = tmp_path / "srv" / "hubpool"
    for data_dir in (default, service):  # both hold a store: the default one from an earlier `hubpool serve`
        RunningNode(data_dir).start().stop()
    spec = sf.ServiceSpec(executable=Path(sys.executable), data_dir=service,
                          env_file=home / ".config" / "hubpool" / "hubpool.env", user=True)
    unit = home / ".config" / "systemd" / "user" / "hubpool.service"
    unit.parent.mkdir(parents=True)
    unit.write_text(sf.systemd_unit(spec))  # the service writer's own unit, as `install --user` leaves it
    r = hubpool("api-key", "create", "--scope", "inference", HOME=str(home))
    assert r.returncode == 1, r.stderr
    assert f"this command read the default data directory {default} (HUB_POOL_DATA_DIR is not set)" in r.stderr
    assert f"The hubpool service installed here keeps its data in {service} ({unit})" in r.stderr, r.stderr
    assert f"env HUB_POOL_DATA_DIR={service} hubpool api-key" in r.stderr
    # named as the message says: the key goes into the service's store
    r = hubpool("api-key", "create", "--scope", "inference", HOME=str(home), HUB_POOL_DATA_DIR=str(service))
    assert r.returncode == 0 and r.stdout.startswith("hpi_"), r.stderr
