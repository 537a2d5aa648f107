"""The CLI: help text, API keys, and talking to its own node."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from harness import RunningNode

COMMANDS = ["serve", "demo", "plugins", "status", "settings", "log", "bench", "bench placement", "api-key", "api-key create", "api-key list",
            "api-key revoke", "service", "service install", "service uninstall", "service status"]


def hubpool(*args: str, env: dict | None = None, timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hubpool_core.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "120", **(env or {})}, timeout=timeout)


def test_root_help_lists_commands():
    r = hubpool("--help")
    assert r.returncode == 0
    for cmd in ("serve", "demo", "plugins", "status", "settings", "log", "api-key"):
        assert cmd in r.stdout
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_every_subcommand_has_help(command):
    r = hubpool(*command.split(), "--help")
    assert r.returncode == 0, r.stderr
    assert "Usage:" in r.stdout and len(r.stdout.splitlines()) > 3


def test_api_keys_create_list_revoke(tmp_path):
    # a node's data directory (a directory no node uses is refused: issue 26 item 22)
    RunningNode(tmp_path).start().stop()
    env = {"HUB_POOL_DATA_DIR": str(tmp_path), "HUB_POOL_LISTEN": "127.0.0.1:9"}
    r = hubpool("api-key", "create", "--scope", "inference", "--name", "editor", env=env)
    assert r.returncode == 0, r.stderr
    key = r.stdout.strip()
    assert key.startswith("hpi_") and "not shown again" in r.stderr
    listed = json.loads(hubpool("api-key", "list", "--json", env=env).stdout)
    assert [k["name"] for k in listed] == ["editor"] and key not in json.dumps(listed)
    assert hubpool("api-key", "revoke", "editor", env=env).returncode == 0
    assert json.loads(hubpool("api-key", "list", "--json", env=env).stdout)[0]["revokedAt"]
    bad = hubpool("api-key", "create", "--scope", "root", env=env)
    assert bad.returncode != 0 and "scope must be one of" in bad.stderr


def test_cli_finds_its_node_through_the_environment(tmp_path):
    with RunningNode(tmp_path / "n") as node:
        env = {"HUB_POOL_DATA_DIR": str(tmp_path / "n"), "HUB_POOL_LISTEN": f"127.0.0.1:{node.port}"}
        r = hubpool("settings", "poolLocalAffinity=4", env=env)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["poolLocalAffinity"] == 4
        bad = hubpool("settings", "poolLocalAffinity=99", env=env)
        assert bad.returncode == 1 and "0–20" in bad.stderr and "Traceback" not in bad.stderr
        status = hubpool("status", env=env)
        assert status.returncode == 0 and "Pooling" in status.stdout
        assert hubpool("log", env=env).returncode == 0


def test_cli_without_a_node_says_what_to_do(tmp_path):
    env = {"HUB_POOL_DATA_DIR": str(tmp_path), "HUB_POOL_LISTEN": "127.0.0.1:9", "HUB_POOL_OPERATOR_KEY": "k"}
    r = hubpool("status", env=env)
    assert r.returncode == 1 and "hubpool serve" in r.stderr and "Traceback" not in r.stderr


def test_bench_placement_prints_the_cost_of_every_stage(tmp_path):
    r = hubpool("bench", "placement", "--rounds", "10", "--json", env={"HUB_POOL_DATA_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert [x["candidates"] for x in data["results"]] == [5, 20, 100]
    assert {"prefix_affinity", "context_cap", "prompt_ceiling", "slots", "local_contention"} <= set(data["stages"])
    assert all(x["baseUs"] > 0 and x["allStagesUs"] > 0 for x in data["results"])
