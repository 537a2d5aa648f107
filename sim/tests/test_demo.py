"""`hubpool demo`: three real nodes come up, pair through the API, place requests across the pool,
and stop, leaving no process behind."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hubpool_sim.demo import TAILNET, tailnet_status

HUB_B = f"hub-b.{TAILNET}"
HUB_C = f"hub-c.{TAILNET}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def demo(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `hubpool demo`; on a timeout, stop it the way Ctrl-C would so it stops its nodes."""
    cmd = [sys.executable, "-m", "hubpool_core.cli", "demo", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"the demo did not finish within {timeout} s:\n{out}\n{err}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def placement_table(out: str) -> dict[tuple[str, str, str], dict[str, str]]:
    """(dialect, route, requested model) → the row's served by, backend, model and status."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "REQUEST" in line and "SERVED BY" in line)
    rows = {}
    for line in lines[start + 1:]:
        if not line.strip():
            break
        dialect, route, requested, served_by, backend, model, status = re.split(r"\s{2,}", line.strip())
        rows[(dialect, route, requested)] = {"served_by": served_by, "backend": backend, "model": model,
                                             "status": status}
    return rows


def is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def port_answers(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.timeout(160)
def test_demo_pairs_three_nodes_places_requests_across_them_and_stops_them():
    port = free_port()
    r = demo("--no-wait", "--port", str(port))
    root = re.search(r"stay in (\S+)", r.stdout)
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        assert "Traceback" not in r.stdout + r.stderr
        for step in ("starting hub-a", "pairing hub-a with hub-b (PIN)", "pairing hub-a with hub-c (PIN)",
                     "pairing hub-b with hub-c (PIN)", "hub-a sees both peers"):
            assert step in r.stdout, step

        rows = placement_table(r.stdout)
        chat = "/v1/chat/completions"
        assert rows[("OpenAI", chat, "llama3.2:3b")] == {"served_by": "local", "backend": "ollama",
                                                         "model": "llama3.2:3b", "status": "200"}
        assert rows[("OpenAI", chat, "qwen3:8b")] == {"served_by": HUB_B, "backend": "vllm", "model": "qwen3:8b",
                                                      "status": "200"}
        assert rows[("Ollama", "/api/chat", "gemma3:4b")] == {"served_by": HUB_C, "backend": "llamacpp",
                                                              "model": "gemma3:4b", "status": "200"}
        streamed = rows[("Ollama", "/api/chat", "qwen3:8b, streamed")]
        assert (streamed["served_by"], streamed["backend"]) == (HUB_B, "vllm")
        assert re.fullmatch(r"200, \d+ lines", streamed["status"]) and int(streamed["status"].split()[1]) > 2
        assert rows[("OpenAI", chat, "auto")]["status"] == "200"
        assert rows[("OpenAI", chat, "auto")]["model"] != "auto"  # hub-a resolved the alias
        assert rows[("Ollama", "/api/embed", "nomic-embed-text")]["served_by"] == "local"

        assert f"curl -s http://127.0.0.1:{port}/v1/models" in r.stdout
        assert f"HUB_POOL_LISTEN=127.0.0.1:{port}" in r.stdout and "hubpool peers" in r.stdout

        # nothing left running: the three nodes the demo printed, and the ports they listened on
        pids = [int(p) for p in re.findall(r"\bpid (\d+)", r.stdout)]
        ports = [int(p) for p in re.findall(r"hubpool serve on http://127\.0\.0\.1:(\d+)", r.stdout)]
        assert len(set(pids)) == 3 and ports[0] == port and len(set(ports)) == 3
        assert not [pid for pid in pids if is_running(pid)]
        assert not [p for p in ports if port_answers(p)]

        # what the user is told to inspect is still there
        assert root, r.stdout
        for name in ("hub-a", "hub-b", "hub-c"):
            log = Path(root.group(1)) / name / "node.log"
            assert log.is_file() and "node listening on" in log.read_text()
    finally:
        if root and Path(root.group(1)).name.startswith("hubpool-demo-"):
            shutil.rmtree(root.group(1), ignore_errors=True)


def test_demo_says_so_when_the_port_is_taken():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = demo("--no-wait", "--port", str(port), timeout=60)
    assert r.returncode == 1
    assert f"port {port} on 127.0.0.1 is already in use; choose another with --port" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr


def test_the_recorded_tailnet_names_each_node_and_its_two_peers():
    from hubpool_tailscale_daemon.directory import TailscaleDaemonDirectory

    names = ["hub-a", "hub-b", "hub-c"]
    status = tailnet_status("hub-b", names)
    me = TailscaleDaemonDirectory._status(status)
    assert (me.connected, me.self_fqdn, me.suffix) == (True, HUB_B, TAILNET)
    peers = TailscaleDaemonDirectory._peers(status)
    assert sorted(p.node_fqdn for p in peers) == [f"hub-a.{TAILNET}", HUB_C]


def test_two_stop_signals_in_a_row_still_stop_cleanly():
    """`uv run` forwards the SIGTERM it gets to the demo, so a demo stopped through its process
    group receives two: the second must not escape as a traceback or cut the cleanup short."""
    cmd = [sys.executable, "-m", "hubpool_core.cli", "demo", "--port", str(free_port())]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    try:
        for line in proc.stdout:  # the demo prints this once the pool is up and waiting
            seen.append(line)
            if "Ctrl-C stops it" in line:
                break
        else:
            pytest.fail("the demo ended before it was up:\n" + "".join(seen))
        pids = [int(m) for m in re.findall(r"pid (\d+)", "".join(seen))]
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGTERM)
        out = "".join(seen) + proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out
    assert "Traceback" not in out and "stopped. The data directories" in out, out
    assert pids and not any(is_running(pid) for pid in pids), out


def test_the_stop_handler_disarms_itself_before_the_cleanup_runs():
    """The process test above cannot always land its second signal in the gap between the first
    handler and the cleanup; this checks the handler closes that gap itself."""
    from hubpool_sim.demo import Stop, _raise_stop

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        with pytest.raises(Stop):
            _raise_stop(signal.SIGTERM, None)
        assert all(signal.getsignal(s) is signal.SIG_IGN for s in saved)
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
