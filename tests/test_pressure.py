"""GPU pressure end to end: the band quantiser, the sampler over real source plugins, and
ranking across real nodes; container rollups validated wholesale."""

from __future__ import annotations

import asyncio
import json
import math
from types import SimpleNamespace

import httpx
import pytest
from harness import fqdn, make_pool, pair
from hubpool_amd_drm.source import AmdDrmPressure
from hubpool_host_file.source import HostFilePressure

from hubpool_core.signals.containers import clamp_containers
from hubpool_core.signals.pressure_bands import BandQuantiser
from hubpool_core.signals.pressure_sampler import PressureSampler
from hubpool_sim import SimConfig, SimModel, run_in_thread

P = "/api/inference/pool"


def bands(readings):
    q = BandQuantiser()
    return [q.feed(r) for r in readings]


def test_a_value_oscillating_across_a_boundary_does_not_flap():
    # hovering around 0.40: once in band 1 it stays until the EWMA drops below 0.35
    seq = bands([0.45, 0.38, 0.42, 0.37, 0.41, 0.38, 0.42])
    assert seq == [1] * len(seq)


def test_rises_may_skip_bands_and_falls_walk_down_one_at_a_time():
    assert bands([0.0, 1.0, 1.0, 1.0, 1.0]) == [0, 1, 1, 2, 3]  # the EWMA climbs 0.4, 0.64, 0.78, 0.87
    q = BandQuantiser()
    q.feed(0.95)
    assert q.band == 3  # a rise may skip bands: none → 3 at once
    falls = [q.feed(0.0) for _ in range(4)]
    assert falls == [2, 1, 0, 0]  # never 3 → 0 in one sample


def test_the_ewma_smooths_a_step():
    q = BandQuantiser()
    q.feed(0.0)
    q.feed(1.0)
    assert math.isclose(q.ewma, 0.4)


def _sysfs(tmp_path, percent):
    card = tmp_path / "drm" / "card0" / "device"
    card.mkdir(parents=True)
    (card / "gpu_busy_percent").write_text(f"{percent}\n")
    return str(tmp_path / "drm")


def test_the_sampler_reads_the_host_file_first_then_sysfs(tmp_path):
    host = tmp_path / "gpu.json"
    env = SimpleNamespace(pressure_host_file=str(host), amd_drm_root=_sysfs(tmp_path, 80))
    sampler = PressureSampler(None, [HostFilePressure(env), AmdDrmPressure(env)])
    assert asyncio.run(sampler.sample_once()) == 2  # no host file: the AMD counter (0.80 → band 2)
    assert sampler.capabilities_fields() == {"gpuPressure": 2, "gpuPressureSource": "amd-drm"}
    host.write_text(json.dumps({"busyPercent": 95}))
    assert asyncio.run(sampler.sample_once()) == 3
    assert sampler.capabilities_fields()["gpuPressureSource"] == "host-file"


def test_an_unmeasured_node_omits_the_band(tmp_path):
    env = SimpleNamespace(pressure_host_file=str(tmp_path / "none.json"), amd_drm_root=str(tmp_path / "nothing"))
    sampler = PressureSampler(None, [HostFilePressure(env), AmdDrmPressure(env)])
    assert asyncio.run(sampler.sample_once()) is None
    assert sampler.capabilities_fields() == {}


@pytest.mark.parametrize("payload", [
    {"running": -1, "stopped": 1, "total": 0, "cpuPercent": 1.0, "memoryBytes": 1},
    {"running": 1, "stopped": 0, "total": 1, "cpuPercent": float("nan"), "memoryBytes": 1},
    {"running": 1, "stopped": 0, "total": 1, "cpuPercent": float("inf"), "memoryBytes": 1},
    {"running": "3", "stopped": 0, "total": 3, "cpuPercent": 1.0, "memoryBytes": 1},
    {"running": 5, "stopped": 0, "total": 3, "cpuPercent": 1.0, "memoryBytes": 1},
    {"running": 2, "stopped": 2, "total": 3, "cpuPercent": 1.0, "memoryBytes": 1},
    {"running": 1, "stopped": 0, "total": 1, "cpuPercent": 1.0},
    {"running": True, "stopped": 0, "total": 1, "cpuPercent": 1.0, "memoryBytes": 1},
    {"running": 1, "stopped": 0, "total": 1, "cpuPercent": 1.0, "memoryBytes": -5},
    "6 running", None, [],
])
def test_malformed_container_payloads_read_as_null(payload):
    assert clamp_containers(payload) is None


def test_a_sane_rollup_survives():
    ok = {"running": 6, "stopped": 2, "total": 8, "cpuPercent": 91.25, "memoryBytes": 5368709120}
    assert clamp_containers(ok) == ok
    assert clamp_containers({**ok, "running": 0, "stopped": 8})["running"] == 0  # idle is a real 0


def test_a_busy_peer_loses_a_tie_at_weight_1_and_wins_it_at_weight_0(tmp_path):
    """hub-a asks for a model only hub-b and hub-c hold; hub-b's host file says 95 % busy."""
    busy = tmp_path / "hub-b-gpu.json"
    busy.write_text(json.dumps({"busyPercent": 95}))
    nothing = str(tmp_path / "no-sysfs")
    with run_in_thread(SimConfig(flavor="vllm", models=[SimModel("shared:8b")])) as sim_b, \
            run_in_thread(SimConfig(flavor="vllm", models=[SimModel("shared:8b")])) as sim_c:
        nodes = make_pool(tmp_path, ["hub-a", "hub-b", "hub-c"], environ={"HUB_POOL_AMD_DRM_ROOT": nothing},
                          per_node={"hub-b": {"VLLM_URL": sim_b.url, "HUB_POOL_PRESSURE_HOST_FILE": str(busy)},
                                    "hub-c": {"VLLM_URL": sim_c.url}})
        for n in nodes.values():
            n.start()
        a, b, c = nodes["hub-a"], nodes["hub-b"], nodes["hub-c"]
        try:
            for other in (b, c):
                pair(a, other)
            assert b.run(b.node.pressure.sample_once()) == 3
            assert c.run(c.node.pressure.sample_once()) is None
            a.run(a.node.health.poll_once())
            status = a.client(headers=a.headers()).get(P + "/status").json()
            by_name = {p["nodeFqdn"]: p for p in status["peers"]}
            assert by_name[fqdn("hub-b")]["gpuPressure"] == 3 and by_name[fqdn("hub-c")]["gpuPressure"] is None

            def served_by():
                r = httpx.post(a.url + "/v1/chat/completions",
                               json={"model": "shared:8b", "messages": [{"role": "user", "content": "x"}]})
                assert r.status_code == 200
                return r.headers["x-hub-pool-served-by"]

            assert served_by() == fqdn("hub-b")  # weight 0: a tie, and hub-b comes first
            with a.client(headers=a.headers()) as cl:
                cl.patch(P + "/settings", json={"poolPressureWeight": 1})
            assert served_by() == fqdn("hub-c")  # weight 1: 3 > unmeasured 1
        finally:
            for n in nodes.values():
                n.stop()
