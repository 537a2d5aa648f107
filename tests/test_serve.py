"""`hubpool serve` as an operator runs it: a real process, logs on stderr, graceful stop."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
from harness import ENGINE_VARS, closed_port_url

from hubpool_sim import SimConfig, SimModel, run_in_thread


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_runs_a_node_and_stops_gracefully(tmp_path):
    cfg = SimConfig(flavor="ollama", models=[SimModel("llama3.2:3b", window=8192)], decode_ms_per_token=40)
    with run_in_thread(cfg) as sim:
        port = _free_port()
        env = {**os.environ, **{v: closed_port_url() for v in ENGINE_VARS}, "OLLAMA_URL": sim.url,
               "HUB_POOL_DATA_DIR": str(tmp_path), "HUB_POOL_LISTEN": f"127.0.0.1:{port}",
               "HUB_POOL_TAILSCALE_CLI": "/nonexistent"}
        proc = subprocess.Popen([sys.executable, "-m", "hubpool_core.cli", "serve"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(base + "/api/inference/pool/identify", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
                time.sleep(0.1)
            assert (tmp_path / "operator.key").exists()
            # the same process, re-executed in place under -OO: no docstrings resident (G7)
            assert "-OO" in open(f"/proc/{proc.pid}/cmdline").read().split("\0")
            with httpx.Client(timeout=30) as c, c.stream(
                "POST", base + "/api/generate", json={"model": "llama3.2:3b", "prompt": "x",
                                                       "options": {"num_predict": 40}}) as r:
                assert r.status_code == 200
                lines = r.iter_lines()
                first = next(lines)
                proc.send_signal(signal.SIGTERM)  # mid-stream: the node lets it finish
                rest = [line for line in lines if line]
            assert first and '"done":true' in rest[-1].replace(" ", "")
            # uvicorn re-raises the caught SIGTERM after a clean shutdown, as process managers expect
            assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
            err = proc.stderr.read()
            assert "node listening on" in err and "Traceback" not in err
        finally:
            if proc.poll() is None:
                proc.kill()


def test_a_directory_named_like_the_package_in_the_working_directory_shadows_nothing(tmp_path):
    """The serve process re-executes itself with `-m` and migrates in a `-c` child: both run with
    -P, or a `hubpool_core` directory where the operator happens to stand would be imported."""
    here = tmp_path / "cwd"
    (here / "hubpool_core").mkdir(parents=True)
    (here / "hubpool_core" / "__init__.py").write_text('raise SystemExit("shadowed by the working directory")\n')
    port = _free_port()
    env = {**os.environ, **{v: closed_port_url() for v in ENGINE_VARS}, "HUB_POOL_DATA_DIR": str(tmp_path / "data"),
           "HUB_POOL_LISTEN": f"127.0.0.1:{port}", "HUB_POOL_TAILSCALE_CLI": "/nonexistent"}
    script = os.path.join(os.path.dirname(sys.executable), "hubpool")
    proc = subprocess.Popen([script, "serve", "--log-level", "info"], cwd=here, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/api/inference/pool/identify", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        err = proc.stderr.read()
        assert "shadowed" not in err and "migrating in-process" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
