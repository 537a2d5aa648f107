"""Container stats and GPU pressure, the whole chain (issue 16 item 16): a fake Docker
Engine on a real Unix socket -> hub-b's docker_stats plugin -> hub-b's capabilities ->
hub-a's health poll -> hub-a's /status and /peers -> `hubpool status` and `hubpool peers`.
/peers applies /status's freshness rule: a stale snapshot shows no containers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest
from harness import fqdn, make_pool, pair

from hubpool_sim.docker_engine import FakeContainer, rollup, run_docker_engine

P = "/api/inference/pool"
FLEET = [FakeContainer("web", cpu_percent=150.0, memory_bytes=3 * 2**29),
         FakeContainer("db", cpu_percent=25.0, memory_bytes=2**30),
         FakeContainer("job", state="exited")]


def cli(node, *args):
    env = {**os.environ, "HUB_POOL_DATA_DIR": str(node.env.data_dir), "HUB_POOL_LISTEN": f"127.0.0.1:{node.port}",
           "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "hubpool_core.cli", *args], capture_output=True, text=True,
                          env=env, timeout=60, stdin=subprocess.DEVNULL)


@pytest.fixture
def chain(tmp_path):
    sock = tmp_path / "d.sock"
    pressure = tmp_path / "gpu.json"
    pressure.write_text(json.dumps({"busyPercent": 90}))
    with run_docker_engine(sock, FLEET) as engine:
        nodes = make_pool(tmp_path, ["hub-a", "hub-b"], per_node={
            "hub-a": {"HUB_POOL_DOCKER_SOCKET": str(tmp_path / "none.sock"),  # no Docker here: off
                      "HUB_POOL_PRESSURE_HOST_FILE": str(tmp_path / "none.json")},
            "hub-b": {"HUB_POOL_DOCKER_SOCKET": str(sock), "HUB_POOL_PRESSURE_HOST_FILE": str(pressure)}})
        for n in nodes.values():
            n.start()
        try:
            a, b = nodes["hub-a"], nodes["hub-b"]
            pair(a, b)
            # the samplers' ticks (60 s and 10 s), run once now
            b.run(b.node.containers.sample_once())
            b.run(b.node.pressure.sample_once())
            a.run(a.node.containers.sample_once())
            a.run(a.node.health.poll_once())
            yield a, b, engine
        finally:
            for n in nodes.values():
                n.stop()


def get(node, path):
    with node.client(headers=node.headers()) as c:
        r = c.get(P + path)
    assert r.status_code == 200, r.text
    return r.json()


def test_containers_and_gpu_pressure_reach_the_operator(chain):
    a, b, engine = chain
    want = rollup(FLEET)
    assert want == {"running": 2, "stopped": 1, "total": 3, "cpuPercent": 175.0, "memoryBytes": 5 * 2**29}
    assert any(c.startswith("/containers/json") for c in engine.calls)  # hub-b asked the socket
    status = get(a, "/status")
    peer = next(p for p in status["peers"] if p["nodeFqdn"] == fqdn("hub-b"))
    assert peer["containers"] == want
    assert peer["gpuPressure"] == 3  # 90 % busy: the top band
    assert status["localNode"]["containers"] is None  # hub-a has no Docker: not reported, not zero
    assert get(b, "/status")["localNode"]["containers"] == want
    listed = next(p for p in get(a, "/peers") if p["nodeFqdn"] == fqdn("hub-b"))
    assert listed["containers"] == want

    out = cli(a, "status")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "Load" in text
    line_b = next(line for line in text.splitlines() if fqdn("hub-b") in line and "containers" in line)
    assert "GPU saturated (band 3 of 3)" in line_b
    assert "containers 2 running, 1 stopped · CPU 175% · memory 2.5 GiB" in line_b
    line_a = next(line for line in text.splitlines() if line.strip().startswith("this node") and "GPU" in line)
    assert "GPU not reported" in line_a and "containers not reported" in line_a

    peers = cli(a, "peers")
    assert peers.returncode == 0, peers.stderr
    assert "containers 2 running, 1 stopped · CPU 175% · memory 2.5 GiB" in peers.stdout
    assert "GPU saturated (band 3 of 3)" in peers.stdout


def test_peers_applies_the_freshness_rule_of_status(chain):
    a, _, _ = chain
    row = next(r for r in a.node.peers.all() if r.node_fqdn == fqdn("hub-b"))
    # as if the last good poll were ten minutes ago: the snapshot is older than three polls
    a.node.peers.update(row.id, last_seen_at=row.last_seen_at - timedelta(minutes=10))
    assert next(p for p in get(a, "/status")["peers"] if p["nodeFqdn"] == fqdn("hub-b"))["containers"] is None
    assert next(p for p in get(a, "/peers") if p["nodeFqdn"] == fqdn("hub-b"))["containers"] is None
    text = cli(a, "status").stdout
    line_b = next(line for line in text.splitlines() if fqdn("hub-b") in line and "containers" in line)
    assert "containers not reported" in line_b
