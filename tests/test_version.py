"""`hubpool --version` names hubpool and every plugin distribution at its version (issue 19)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _check_wheels():
    spec = importlib.util.spec_from_file_location("check_wheels", ROOT / "scripts" / "check_wheels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_version_names_every_workspace_distribution():
    r = subprocess.run([sys.executable, "-m", "hubpool_core.cli", "--version"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "COLUMNS": "120"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("hubpool 0.")  # the core first
    expected = _check_wheels().workspace_distributions()
    seen = dict(line.split() for line in lines)
    assert seen == {name: info["version"] for name, info in expected.items()}
    assert len(seen) == 14  # hubpool, twelve plugins (docker_stats the newest), the simulator


def test_version_works_after_other_words_and_in_help():
    r = subprocess.run([sys.executable, "-m", "hubpool_core.cli", "--version", "status"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("hubpool ")
    assert "hubpool-ollama" in r.stdout
    r = subprocess.run([sys.executable, "-m", "hubpool_core.cli", "--help"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "COLUMNS": "120"})
    assert "--version" in r.stdout
