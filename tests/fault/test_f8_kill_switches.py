"""F8: the kill-switch precedence over all 128 combinations of its seven inputs — the three
environment flags (HUB_POOL_USER_DISABLED, HUB_POOL_OUTBOUND_DISABLED, HUB_POOL_INBOUND_DISABLED),
the three settings (poolEnabled, poolOutboundEnabled, poolInboundEnabled) and the per-peer
switch — at the resolver and over HTTP.

The expected answer comes from an oracle written from the spec's text ("Kill switches: three
levels, one precedence"), not from the code under test: the master (env first) short-circuits
both directions; then a direction's env flag, then its setting; the per-peer switch applies to
that peer only, both ways. Over HTTP: /capabilities answers 503 when the master is off, else 200
with acceptingWork = inbound on and this peer enabled; /local/* answers 503 (never 403) whenever
the node will not take the peer's work; and outbound work reaches the peer only when outbound is
on and the peer is enabled.
"""

from __future__ import annotations

import itertools
import socket
import time
from typing import Any

import httpx
import pytest
from harness import RunningNode, fqdn, make_pool, pair

from hubpool_core.config import EnvSettings, PoolSettings
from hubpool_core.node.directions import resolve_directions
from hubpool_core.placement import usable_peers
from hubpool_core.store import PoolPeer
from hubpool_sim import SimConfig, SimModel, run_in_thread

P = "/api/inference/pool"
ENV_FLAGS = ("HUB_POOL_USER_DISABLED", "HUB_POOL_OUTBOUND_DISABLED", "HUB_POOL_INBOUND_DISABLED")
SETTINGS = ("poolEnabled", "poolOutboundEnabled", "poolInboundEnabled")
#: a combination: (user env off, outbound env off, inbound env off, poolEnabled false,
#: poolOutboundEnabled false, poolInboundEnabled false, peer disabled)
COMBOS = list(itertools.product((False, True), repeat=7))
X_MODEL, Y_MODEL = "llama3.2:3b", "qwen3:8b"


def oracle(c: tuple[bool, ...]) -> dict[str, Any]:
    """What the spec says seven switch positions mean."""
    env_user, env_out, env_in, set_master, set_out, set_in, peer_off = c
    master_by = "env" if env_user else "setting" if set_master else None

    def direction(env_flag: bool, setting_off: bool) -> tuple[bool, str | None]:
        if master_by:
            return False, master_by
        if env_flag:
            return False, "env"
        if setting_off:
            return False, "setting"
        return True, None

    out, out_by = direction(env_out, set_out)
    inb, in_by = direction(env_in, set_in)
    master_on = master_by is None
    return {
        "master": (master_on, master_by),
        "outbound": (out, out_by),
        "inbound": (inb, in_by),
        "reason": ("disabled_by_env" if master_by == "env" else "disabled_by_setting" if master_by
                   else "partially_disabled" if (not out or not inb or peer_off) else "active"),
        "capabilities": 503 if not master_on else 200,
        "acceptingWork": None if not master_on else (inb and not peer_off),
        "local": 200 if (master_on and inb and not peer_off) else 503,
        "routesToPeer": out and not peer_off,
    }


def env_for(c: tuple[bool, ...]) -> dict[str, str]:
    return {flag: "true" for flag, on in zip(ENV_FLAGS, c[:3]) if on}


def settings_for(c: tuple[bool, ...]) -> dict[str, bool]:
    return {key: not off for key, off in zip(SETTINGS, c[3:6])}


def test_f8_resolver_all_128_combinations():
    """resolve_directions and the per-peer placement gate, against the oracle, for every combination."""
    peer = PoolPeer(id="p", node_fqdn="hub-y.example", direction="outbound", status="connected")
    for c in COMBOS:
        want = oracle(c)
        env = EnvSettings.from_environ(env_for(c))
        d = resolve_directions(env, PoolSettings(**settings_for(c)))
        got = {"master": (d.master.enabled, d.master.disabled_by), "outbound": (d.outbound.enabled, d.outbound.disabled_by),
               "inbound": (d.inbound.enabled, d.inbound.disabled_by)}
        assert got == {k: want[k] for k in got}, (c, got, want)
        peer.enabled = not c[6]
        assert bool(usable_peers([peer], d.outbound.enabled)) == want["routesToPeer"], c
        fields = d.status_fields(connected_peers=1, connected_enabled_peers=0 if c[6] else 1)
        assert fields["reason"] == want["reason"], (c, fields)
        assert fields["routingActive"] == want["routesToPeer"], (c, fields)
        # the seven inputs are real: every one of them changes the answer somewhere
    assert len({tuple(sorted(oracle(c).items())) for c in COMBOS}) > 10


def _rebind(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    deadline = time.monotonic() + 10
    while True:
        try:
            sock.bind(("127.0.0.1", port))
            return sock
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.mark.fault
@pytest.mark.timeout(240)
def test_f8_over_http_all_128_combinations(tmp_path, report):
    """Node X holds the switches; its peer Y calls X's /capabilities and /local/api/chat signed,
    and X is asked for a model only Y serves. The environment flags are set the only way they
    can be (X restarts with them, same port and data directory); the settings through PATCH;
    the per-peer switch through /peers/{id}/enable|disable."""
    started = time.monotonic()
    x_sim_cfg = SimConfig(flavor="ollama", models=[SimModel(X_MODEL)])
    y_sim_cfg = SimConfig(flavor="ollama", models=[SimModel(Y_MODEL)])
    with run_in_thread(x_sim_cfg) as x_sim, run_in_thread(y_sim_cfg) as y_sim:
        nodes = make_pool(tmp_path, ["hub-a", "hub-b"], per_node={"hub-a": {"OLLAMA_URL": x_sim.url},
                                                                   "hub-b": {"OLLAMA_URL": y_sim.url}})
        x, y = nodes["hub-a"].start(), nodes["hub-b"].start()
        try:
            pair(x, y)
            base_environ = dict(x.environ)
            y_row = next(r for r in y.node.peers.all() if r.node_fqdn == fqdn("hub-a"))
            checked = 0
            seen_capabilities, seen_local = set(), set()
            for env_combo in itertools.product((False, True), repeat=3):
                x.stop()
                x = RunningNode(tmp_path / "hub-a", {**base_environ, **env_for(env_combo + (False,) * 4)},
                                sock=_rebind(x.port)).start()
                with x.client(headers=x.headers()) as c:
                    peer_id = next(p["id"] for p in c.get(P + "/peers").json() if p["nodeFqdn"] == fqdn("hub-b"))
                    _until_offered(c, peer_id)
                for rest in itertools.product((False, True), repeat=4):
                    combo = env_combo + rest
                    want = oracle(combo)
                    with x.client(headers=x.headers()) as c:
                        r = c.patch(P + "/settings", json=settings_for(combo))
                        assert r.status_code == 200, r.text
                        r = c.post(P + f"/peers/{peer_id}/{'disable' if combo[6] else 'enable'}")
                        assert r.status_code == 200, r.text
                        status = c.get(P + "/status").json()
                    directions = status["directions"]
                    assert (status["enabled"], status["disabledBy"]) == want["master"], (combo, status)
                    assert (directions["outbound"]["enabled"], directions["outbound"]["disabledBy"]) == want["outbound"]
                    assert (directions["inbound"]["enabled"], directions["inbound"]["disabledBy"]) == want["inbound"]
                    assert status["reason"] == want["reason"], (combo, status["reason"], want)

                    caps = _signed(y, y_row, x, "GET", P + "/capabilities")
                    seen_capabilities.add(caps.status_code)
                    assert caps.status_code == want["capabilities"], (combo, caps.status_code, caps.text)
                    if caps.status_code == 200:
                        body = caps.json()
                        assert body["acceptingWork"] is want["acceptingWork"], (combo, body)
                        assert bool(body["backends"]) is want["acceptingWork"], (combo, body)
                        assert "hardwareTier" in body and "inFlightRequests" in body

                    chat = {"model": X_MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": False}
                    local = _signed(y, y_row, x, "POST", P + "/local/api/chat", chat,
                                    {"X-Hub-Pool-Backend": "ollama", "X-Hub-Pool-Model": X_MODEL})
                    seen_local.add(local.status_code)
                    assert local.status_code == want["local"], (combo, local.status_code, local.text)
                    assert local.status_code != 403

                    asked = httpx.post(x.url + "/api/chat", json={**chat, "model": Y_MODEL}, timeout=15,
                                       trust_env=False)
                    served = asked.status_code == 200 and asked.headers.get("x-hub-pool-served-by") == fqdn("hub-b")
                    assert served is want["routesToPeer"], (combo, asked.status_code, asked.text[:200])
                    if not served:
                        assert asked.status_code >= 400 and "x-hub-pool-served-by" not in asked.headers
                    checked += 1
            assert checked == 128
            assert seen_capabilities == {200, 503} and seen_local == {200, 503}
            report("F8", {"combinations": checked, "capabilitiesStatuses": sorted(seen_capabilities),
                          "localStatuses": sorted(seen_local), "restarts": 8,
                          "seconds": round(time.monotonic() - started, 1)})
        finally:
            x.stop()
            y.stop()


def _until_offered(c: httpx.Client, peer_id: str) -> None:
    """Until X holds Y's capabilities with Y's model (a restart keeps them; a poll refreshes them)."""
    deadline = time.monotonic() + 15
    while True:
        peer = next(p for p in c.get(P + "/peers").json() if p["id"] == peer_id)
        caps = peer.get("lastCapabilities") or {}
        if peer["status"] == "connected" and any(Y_MODEL in b["modelsLoaded"] for b in caps.get("backends", [])):
            return
        assert time.monotonic() < deadline, peer
        time.sleep(0.1)


def _signed(sender: RunningNode, row: Any, recipient: RunningNode, method: str, path: str, body: Any = None,
            extra: dict[str, str] | None = None) -> httpx.Response:
    """A request signed by ``sender``'s own peer client, as its relay and poller sign theirs."""
    headers = sender.run(sender.node.peer_client.auth_headers(row, method, path, body))
    return httpx.request(method, recipient.url + path, json=body, headers={**headers, **(extra or {})},
                         timeout=15, trust_env=False)
