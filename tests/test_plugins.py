"""The plugin host: discovery, selection before import, failure isolation, listing."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
from harness import RunningNode

FIRST_PARTY = {"ollama", "vllm", "llamacpp", "lemonade", "omlx", "tailscale_daemon", "tailscale_admin",
               "portal", "amd_drm"}


def _hubpool(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hubpool_core.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=60)


def _fake_distribution(root: Path, name: str, body: str) -> None:
    """A tiny installed distribution with one hubpool.plugins entry point."""
    pkg = root / f"hubpool_{name}"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(body))
    info = root / f"hubpool_{name}-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: hubpool-{name}\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text(f"[hubpool.plugins]\n{name} = hubpool_{name}\n")


def test_plugins_json_lists_first_party_all_active(tmp_path):
    r = _hubpool("plugins", "--json", env={"HUB_POOL_DATA_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    rows = {p["name"]: p for p in json.loads(r.stdout)["plugins"]}
    assert FIRST_PARTY <= set(rows)
    for name in FIRST_PARTY:
        assert rows[name]["active"] is True, rows[name]
        assert rows[name]["distribution"] == "hubpool-" + name.replace("_", "-")
        assert rows[name]["version"]
    assert {rows[n]["kind"] for n in ("ollama", "vllm", "llamacpp", "lemonade", "omlx")} == {"engine"}
    assert {rows[n]["kind"] for n in ("tailscale_daemon", "tailscale_admin", "portal")} == {"directory"}
    assert rows["amd_drm"]["kind"] == "pressure" and rows["amd_drm"]["order"] == 200


def test_plugins_table_reads_well(tmp_path):
    r = _hubpool("plugins", env={"HUB_POOL_DATA_DIR": str(tmp_path), "COLUMNS": "200"})
    assert r.returncode == 0
    assert "NAME" in r.stdout and "amd_drm" in r.stdout and "active" in r.stdout


def test_a_plugin_that_fails_to_import_is_listed_and_the_node_still_serves(tmp_path, ollama_sim):
    site = tmp_path / "site"
    _fake_distribution(site, "broken", "raise RuntimeError('boom at import')\n")
    env = {"HUB_POOL_DATA_DIR": str(tmp_path / "d"), "PYTHONPATH": str(site)}
    r = _hubpool("plugins", "--json", env=env)
    rows = {p["name"]: p for p in json.loads(r.stdout)["plugins"]}
    assert rows["broken"]["active"] is False
    assert "RuntimeError: boom at import" in rows["broken"]["reason"]
    assert rows["ollama"]["active"] is True
    # and a node with it installed still serves
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    try:
        with RunningNode(tmp_path / "n", {"OLLAMA_URL": ollama_sim.url}) as node:
            rec = {r.name: r for r in node.node.plugins.records}
            assert rec["broken"].active is False
            assert httpx.post(node.url + "/api/chat", json={"model": "llama3.2:3b", "stream": False,
                                                            "messages": [{"role": "user", "content": "x"}]}
                              ).status_code == 200
    finally:
        sys.path.remove(str(site))


def test_disabled_plugin_is_never_imported(tmp_path):
    site = tmp_path / "site"
    marker = tmp_path / "imported"
    _fake_distribution(site, "spy", f"open({str(marker)!r}, 'w').write('x')\n")
    env = {"HUB_POOL_DATA_DIR": str(tmp_path / "d"), "PYTHONPATH": str(site), "HUB_POOL_PLUGINS_DISABLED": "spy, vllm"}
    rows = {p["name"]: p for p in json.loads(_hubpool("plugins", "--json", env=env).stdout)["plugins"]}
    assert rows["spy"]["active"] is False and rows["spy"]["reason"] == "disabled by HUB_POOL_PLUGINS_DISABLED"
    assert rows["vllm"]["active"] is False
    assert not marker.exists()
    # the persisted setting does the same
    (tmp_path / "d2").mkdir()
    (tmp_path / "d2" / "settings.json").write_text(json.dumps({"pluginsDisabled": ["spy"]}))
    env = {"HUB_POOL_DATA_DIR": str(tmp_path / "d2"), "PYTHONPATH": str(site)}
    rows = {p["name"]: p for p in json.loads(_hubpool("plugins", "--json", env=env).stdout)["plugins"]}
    assert rows["spy"]["reason"] == "disabled by setting pluginsDisabled"
    assert not marker.exists()


def test_a_plugin_breaking_the_contract_is_inactive(tmp_path):
    site = tmp_path / "site"
    _fake_distribution(site, "wrongsig", """
        from hubpool_core import hookimpl
        @hookimpl
        def hubpool_register_engines(register, surprise):
            pass
    """)
    _fake_distribution(site, "wrongtype", """
        from hubpool_core import hookimpl
        @hookimpl
        def hubpool_register_engines(register):
            register(object)
    """)
    env = {"HUB_POOL_DATA_DIR": str(tmp_path / "d"), "PYTHONPATH": str(site)}
    rows = {p["name"]: p for p in json.loads(_hubpool("plugins", "--json", env=env).stdout)["plugins"]}
    assert rows["wrongsig"]["active"] is False and "contract" in rows["wrongsig"]["reason"]
    assert rows["wrongtype"]["active"] is False and "not a subclass of Engine" in rows["wrongtype"]["reason"]
    assert rows["ollama"]["active"] is True


def test_core_runs_with_zero_plugins_and_a_fake_engine(tmp_path):
    from fake_engine import FakeEnginePlugin

    everything = ",".join(FIRST_PARTY)
    with RunningNode(tmp_path / "n", {"HUB_POOL_PLUGINS_DISABLED": everything},
                     extra_plugins=(("fake", FakeEnginePlugin),)) as node:
        kinds = [e.kind for e in node.node.local.engines]
        assert kinds == ["fake"]
        r = httpx.get(node.url + "/v1/models")
        assert r.status_code == 200 and r.json()["data"][0]["id"] == "fake-model"
