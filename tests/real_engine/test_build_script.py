"""scripts/build_llama_server.py without building: where it installs, and that a cached
binary makes it a no-op (CI runs it before every pytest, so that path must cost nothing)."""

from __future__ import annotations

import os
import subprocess
import sys

from real_engine.support import BUILD_SCRIPT, llama_cpp_version


def run_script(*args: str, cache) -> subprocess.CompletedProcess:
    env = {**os.environ, "HUBPOOL_LLAMA_SERVER_CACHE": str(cache)}
    return subprocess.run([sys.executable, str(BUILD_SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=60)


def test_the_cache_folder_is_overridable_and_versioned(tmp_path):
    done = run_script("--print-path", cache=tmp_path / "c")
    assert done.returncode == 0
    assert done.stdout.strip() == str(tmp_path / "c" / llama_cpp_version() / "llama-server")


def test_a_cached_binary_is_a_no_op_that_prints_its_path(tmp_path):
    binary = tmp_path / llama_cpp_version() / "llama-server"
    binary.parent.mkdir(parents=True)
    binary.write_bytes(b"#!/bin/sh\n")
    binary.chmod(0o755)
    done = run_script(cache=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(binary)
    assert "already built" in done.stdout
    assert "downloading" not in done.stdout  # nothing fetched, nothing compiled


def test_a_bad_argument_is_a_usage_error_not_a_stack_trace(tmp_path):
    done = run_script("--jobs", "many", cache=tmp_path)
    assert done.returncode == 2 and "invalid int value" in done.stderr and "Traceback" not in done.stderr
