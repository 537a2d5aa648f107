"""The pool page shows each node's GPU pressure band and container rollup (issue 16 item 16):
a fake Docker Engine behind hub-b, hub-a's page in a real browser."""

from __future__ import annotations

import json

from harness import fqdn, make_pool, pair
from web.ui_helpers import new_page, sign_in

from hubpool_sim.docker_engine import FakeContainer, run_docker_engine

FLEET = [FakeContainer("web", cpu_percent=150.0, memory_bytes=3 * 2**29),
         FakeContainer("db", cpu_percent=25.0, memory_bytes=2**30),
         FakeContainer("job", state="exited")]


def test_the_pool_page_shows_gpu_pressure_and_containers(browser, tmp_path):
    sock = tmp_path / "d.sock"
    pressure = tmp_path / "gpu.json"
    pressure.write_text(json.dumps({"busyPercent": 90}))
    with run_docker_engine(sock, FLEET):
        nodes = make_pool(tmp_path, ["hub-a", "hub-b"], per_node={
            "hub-a": {"HUB_POOL_DOCKER_SOCKET": str(tmp_path / "none.sock"),
                      "HUB_POOL_PRESSURE_HOST_FILE": str(tmp_path / "none.json")},
            "hub-b": {"HUB_POOL_DOCKER_SOCKET": str(sock), "HUB_POOL_PRESSURE_HOST_FILE": str(pressure)}})
        for n in nodes.values():
            n.start()
        try:
            a, b = nodes["hub-a"], nodes["hub-b"]
            pair(a, b)
            b.run(b.node.containers.sample_once())
            b.run(b.node.pressure.sample_once())
            a.run(a.node.health.poll_once())
            page = new_page(browser)
            sign_in(page, a)
            page.goto(a.url + "/ui/pool")
            row = page.locator(f'tr[data-peer="{fqdn("hub-b")}"]')
            row.wait_for()
            assert row.locator('td[data-label="GPU"]').inner_text() == "Saturated (band 3 of 3)"
            assert row.locator('td[data-label="Containers"]').inner_text() == \
                "2 running, 1 stopped · CPU 175% · memory 2.5 GiB"
            kv = page.locator("#node-kv").inner_text()
            assert "GPU pressure\nNot reported" in kv and "Containers\nNot reported" in kv  # hub-a: none
            assert page.js_errors == []
        finally:
            for n in nodes.values():
                n.stop()
