"""scripts/install_agent_clients.py without the network: where it installs, what it counts as
installed (every pinned version and every binary), and the command it runs and the tests name."""

from __future__ import annotations

import json

import pytest
from real_clients.agents import install_hint, installer

pytestmark = pytest.mark.real_clients


def _fake_install(root, versions: dict[str, str], binaries: bool = True) -> None:
    module = installer()
    for name, version in versions.items():
        manifest = root / "node_modules" / name / "package.json"
        manifest.parent.mkdir(parents=True, exist_ok=True)
        manifest.write_text(json.dumps({"name": name, "version": version}))
    if binaries:
        for path in module.binaries(root).values():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("#!/bin/sh\n")


def test_the_clients_count_as_installed_only_at_every_pinned_version_with_their_binaries(tmp_path, monkeypatch):
    module = installer()
    monkeypatch.setenv(module.ENV, str(tmp_path / "clients"))
    root = module.cache_root()
    assert root == tmp_path / "clients"
    assert len(module.missing()) == 6  # three packages absent, three binaries missing
    pinned = {name: version for name, (version, _) in module.PINNED.items()}
    _fake_install(root, {**pinned, "@openai/codex": "0.1.0"})
    assert module.missing() == [f"@openai/codex 0.1.0 (pinned {pinned['@openai/codex']})"]
    _fake_install(root, pinned)
    assert module.missing() == []
    assert module.install() == root / "node_modules" / ".bin"  # already there: nothing runs
    command = module.npm_command()
    assert command[:4] == ["npm", "install", "--prefix", str(root)]
    assert {f"{name}@{version}" for name, version in pinned.items()} <= set(command)
    assert " ".join(command) in install_hint()


def test_without_npm_the_install_says_how_to_get_it(tmp_path, monkeypatch):
    module = installer()
    monkeypatch.setenv(module.ENV, str(tmp_path / "clients"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(module.InstallError, match="apt-get install nodejs npm"):
        module.install()
    assert module.main([]) == 1
