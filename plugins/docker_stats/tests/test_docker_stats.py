"""The Docker source against a fake Docker Engine on a real Unix socket (hubpool_sim)."""

from __future__ import annotations

import logging
import socket
from types import SimpleNamespace

import pluggy
import pytest
from hubpool_docker_stats import DockerStats
from hubpool_docker_stats.source import cpu_percent, memory_bytes, socket_path

from hubpool_core import hookspecs
from hubpool_core.signals.containers import clamp_containers
from hubpool_sim.docker_engine import FakeContainer, rollup, run_docker_engine

FLEET = [FakeContainer("web", cpu_percent=50.0, memory_bytes=512 * 2**20),
         FakeContainer("db", cpu_percent=25.5, memory_bytes=2**30),
         FakeContainer("job", state="exited"), FakeContainer("cron", state="paused")]


def env(**environ: str) -> SimpleNamespace:
    return SimpleNamespace(environ=lambda: environ)


@pytest.fixture
def sock(tmp_path):
    return tmp_path / "d.sock"


def test_counts_and_sums_what_the_engine_reports(sock):
    with run_docker_engine(sock, FLEET) as engine:
        got = DockerStats(env(HUB_POOL_DOCKER_SOCKET=str(sock)))()
        assert got == rollup(FLEET) == {"running": 2, "stopped": 2, "total": 4, "cpuPercent": 75.5,
                                        "memoryBytes": 512 * 2**20 + 2**30}
        assert clamp_containers(got) == got  # what the sampler accepts, unchanged
        asked = sorted(c.split("?")[0] for c in engine.calls)
        # one list and a stats call per running container only; no names leave the source
        assert asked == sorted(["/containers/json", f"/containers/{FLEET[0].id}/stats",
                                f"/containers/{FLEET[1].id}/stats"])


def test_nothing_running_is_zero_not_absent(sock):
    with run_docker_engine(sock, [FakeContainer("job", state="exited")]):
        assert DockerStats(env(HUB_POOL_DOCKER_SOCKET=str(sock)))() == {
            "running": 0, "stopped": 1, "total": 1, "cpuPercent": 0.0, "memoryBytes": 0}


def test_no_socket_is_off_and_calls_nothing(tmp_path, monkeypatch):
    def no_connect(*a, **k):
        raise AssertionError("no call may be made without a socket")

    monkeypatch.setattr(socket.socket, "connect", no_connect)
    assert DockerStats(env(HUB_POOL_DOCKER_SOCKET=str(tmp_path / "absent.sock")))() is None
    plain = tmp_path / "not-a-socket"
    plain.write_text("")
    assert DockerStats(env(HUB_POOL_DOCKER_SOCKET=str(plain)))() is None


def test_a_failing_daemon_reports_nothing_and_warns_once(sock, caplog):
    with run_docker_engine(sock, FLEET) as engine:
        source = DockerStats(env(HUB_POOL_DOCKER_SOCKET=str(sock)))
        engine.down = True
        with caplog.at_level(logging.DEBUG, logger="hubpool_docker_stats"):
            assert source() is None
            assert source() is None
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "answered HTTP 500" in warnings[0].getMessage()
        engine.down = False
        assert source() == rollup(FLEET)


def test_a_label_filter_is_sent_to_the_engine(sock):
    with run_docker_engine(sock, FLEET) as engine:
        DockerStats(env(HUB_POOL_DOCKER_SOCKET=str(sock), HUB_POOL_DOCKER_LABEL="com.docker.compose.project"))()
        listed = next(c for c in engine.calls if c.startswith("/containers/json"))
        assert "filters=" in listed and "com.docker.compose.project" in listed


def test_socket_path_precedence():
    assert socket_path({"HUB_POOL_DOCKER_SOCKET": "/a.sock", "DOCKER_HOST": "unix:///b.sock"}) == "/a.sock"
    assert socket_path({"DOCKER_HOST": "unix:///b.sock"}) == "/b.sock"
    assert socket_path({"DOCKER_HOST": "tcp://10.0.0.1:2375"}) == "/var/run/docker.sock"
    assert socket_path({}) == "/var/run/docker.sock"


def test_cpu_and_memory_formulas_match_docker_stats():
    stats = {"cpu_stats": {"cpu_usage": {"total_usage": 3_000}, "system_cpu_usage": 20_000, "online_cpus": 4},
             "precpu_stats": {"cpu_usage": {"total_usage": 1_000}, "system_cpu_usage": 10_000},
             "memory_stats": {"usage": 1_000, "stats": {"total_inactive_file": 300}}}
    assert cpu_percent(stats) == pytest.approx(80.0)  # 2000/10000 * 4 * 100
    assert memory_bytes(stats) == 700
    assert cpu_percent({"cpu_stats": {}, "precpu_stats": {}}) == 0.0  # a first sample has no delta
    assert memory_bytes({"memory_stats": {}}) == 0


def test_registers_a_class_through_the_hook():
    import hubpool_docker_stats

    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.register(hubpool_docker_stats)
    got: list = []
    pm.hook.hubpool_register_container_stats(register=got.append)
    assert got == [DockerStats]
