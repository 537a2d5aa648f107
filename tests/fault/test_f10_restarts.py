"""F10: a node restarts, cleanly and after a crash, while its peers' clocks lag.

hub-b serves the model; hub-a's clock lags 30 s and hub-c's 290 s, both inside the 300 s a
signature may be off. In-thread, a lagging clock is faked where the sender reads it: the
signing call of the peer client, shifted per sender UUID (beside F9's frozen health clock,
which drives the polls); as `hubpool serve` processes, by HUB_POOL_DEV_CLOCK_OFFSET_MS, and
the crash is a SIGKILL. After each restart of hub-b:

- a request hub-b accepted before the restart, replayed, is refused (a clean restart knows
  its nonce: 401; after a crash it is signed before the start, which hub-b cannot judge:
  a retryable 503);
- hub-a and hub-c keep routing to hub-b at once: their health probes pass (never a strike,
  never a back-off) and their chat requests are served by hub-b.

Before issue 16 item 13, hub-b refused every signature timestamped before its start, so each
lagging peer read as "credentials refused" right after the restart and was backed off.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
from harness import RunningNode, fqdn, make_pool, pair, poll_until_offered
from rig import Rig, chat_body
from test_f9_clocks import FrozenClock

from hubpool_core.config import EnvSettings
from hubpool_core.peering import client as peer_client
from hubpool_core.peering import health, signing
from hubpool_core.peering.identity import IdentityStore, node_secret_path
from hubpool_core.store import Database
from hubpool_sim import SimConfig, SimModel, run_in_thread

pytestmark = [pytest.mark.fault, pytest.mark.timeout(180)]

MODEL = "llama3.2:3b"
P = "/api/inference/pool"
LAGS_MS = {"hub-a": 30_000, "hub-c": 290_000}
NONCE_FILE = "peer-nonces.json"  # what the node leaves in its data directory (peering/nonce_file.py)


@pytest.fixture
def lagging(monkeypatch):
    """``lagging[uuid] = ms``: that sender's signatures are made by a clock ``ms`` behind."""
    lags: dict[str, int] = {}
    real = signing.sign_headers

    def sign(keypair, method, path, sender_uuid, *args, now_ms=None, **kw):
        now = signing._now_ms() if now_ms is None else now_ms  # noqa: SLF001 - the suite's clock
        return real(keypair, method, path, sender_uuid, *args, now_ms=now - lags.get(sender_uuid, 0), **kw)

    monkeypatch.setattr(peer_client, "sign_headers", sign)
    return lags


def _restart(node: RunningNode) -> RunningNode:
    """The same data directory and port, a new process-worth of state (a new Node)."""
    port = node.port
    node.stop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return RunningNode(node.env.data_dir, node.environ, sock=sock).start()


def _chat(node: RunningNode, tag: str) -> httpx.Response:
    with node.client() as c:
        return c.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": tag}]})


def _captured(sender: RunningNode, recipient: RunningNode, lag_ms: int) -> dict[str, str]:
    """A genuine request from ``sender`` (its own key, its own lagging clock) to ``recipient``."""
    kp = sender.node.identity.get()
    return signing.sign_headers(kp, "GET", P + "/capabilities", kp.node_uuid, fqdn(sender.env.data_dir.name),
                                recipient.node.identity.get().node_uuid, None,
                                now_ms=signing._now_ms() - lag_ms)  # noqa: SLF001


def _keeps_routing(clock: FrozenClock, b: RunningNode, lagging_nodes: dict[str, RunningNode], when: str) -> dict:
    """Each lagging peer probes hub-b three polls in a row (frozen health clock) and sends a
    chat: every probe passes, nothing is struck or backed off, hub-b serves every chat."""
    seen = {}
    for name, node in lagging_nodes.items():
        row = node.node.peers.by_fqdn(fqdn("hub-b"))
        for poll in range(3):
            clock.t += 30
            node.run(node.node.health.probe(row))
            failure = node.node.health.failures.get(row.id)
            assert failure is None, (when, name, poll, failure)
            row = node.node.peers.by_id(row.id)
            assert row.status == "connected" and row.consecutive_failures == 0, (when, name, row.status)
        r = _chat(node, f"{name} {when}")
        assert r.status_code == 200 and r.headers["x-hub-pool-served-by"] == fqdn("hub-b"), (when, name, r.text)
        seen[name] = r.headers["x-hub-pool-request-id"]
    inbound = [x for x in b.node.routing_log.query(limit=200)["entries"] if x["direction"] == "inbound"]
    refused = [x for x in inbound if (x["status"] or 0) >= 400]
    assert not refused, (when, refused)
    return seen


def test_f10_a_restart_refuses_replays_and_never_backs_off_lagging_peers(tmp_path, lagging, monkeypatch, report):
    clock = FrozenClock(1_800_000_000.0)
    monkeypatch.setattr(health, "time", clock)
    started = time.monotonic()
    cfg = SimConfig(flavor="ollama", models=[SimModel(MODEL)])
    with run_in_thread(cfg) as sim:
        nodes = make_pool(tmp_path, ["hub-a", "hub-b", "hub-c"], per_node={"hub-b": {"OLLAMA_URL": sim.url}})
        a, b, c = (nodes[n].start() for n in ("hub-a", "hub-b", "hub-c"))
        try:
            for name in LAGS_MS:
                lagging[nodes[name].node.identity.get().node_uuid] = LAGS_MS[name]
            pair(a, b)
            pair(c, b)
            for node in (a, c):
                node.run(node.node.health.stop())  # the test drives every poll itself
                poll_until_offered(node, [b], MODEL)
            assert _chat(a, "before").headers["x-hub-pool-served-by"] == fqdn("hub-b")
            assert _chat(c, "before").headers["x-hub-pool-served-by"] == fqdn("hub-b")

            # a clean restart (the server drains, the node stops)
            captured = _captured(a, b, LAGS_MS["hub-a"])
            assert httpx.get(b.url + P + "/capabilities", headers=captured).status_code == 200
            b = _restart(b)
            clean_replay = httpx.get(b.url + P + "/capabilities", headers=captured)
            _keeps_routing(clock, b, {"hub-a": a, "hub-c": c}, "after a clean restart")
            assert clean_replay.status_code == 401, clean_replay.text

            # a crash: the disk as the process left it after its last health tick, before the
            # request captured here (a kill leaves no clean record)
            b.node.housekeeping()
            record = Path(b.env.data_dir) / NONCE_FILE
            crash_image = record.read_bytes() if record.exists() else None
            captured = _captured(c, b, LAGS_MS["hub-c"])
            assert httpx.get(b.url + P + "/capabilities", headers=captured).status_code == 200
            b.stop()
            if crash_image is None:
                record.unlink(missing_ok=True)
            else:
                record.write_bytes(crash_image)
            b = _restart(b)
            crash_replay = httpx.get(b.url + P + "/capabilities", headers=captured)
            _keeps_routing(clock, b, {"hub-a": a, "hub-c": c}, "after a crash")
            assert crash_replay.status_code == 503 and crash_replay.headers.get("retry-after"), crash_replay.text
            report("F10", {"lagsMs": LAGS_MS, "cleanReplay": clean_replay.status_code,
                           "crashReplay": crash_replay.status_code, "probeFailuresAfterRestarts": 0,
                           "wallS": round(time.monotonic() - started, 1)})
        finally:
            for node in (a, b, c):
                node.stop()


def _keypair_of(node) -> object:
    """A running process's identity, read from its data directory (what a capture would carry)."""
    env = EnvSettings.from_environ({"HUB_POOL_DATA_DIR": str(node.data_dir)})
    return IdentityStore(Database(env.resolved_database_url()), node_secret_path(node.data_dir)).get()


def test_f10_processes_sigterm_and_sigkill_with_peers_lagging_30_and_290_s(tmp_path, report):
    offsets = {name: {"HUB_POOL_DEV_CLOCK_OFFSET_MS": str(-lag)} for name, lag in LAGS_MS.items()}
    with Rig(tmp_path, ["hub-a", "hub-b", "hub-c"], per_node=offsets, warm=("hub-b",)) as rig:
        a, b, c = (rig.nodes[n] for n in ("hub-a", "hub-b", "hub-c"))
        for node in (a, c):  # their work goes to hub-b while hub-b takes it
            node.op("POST", "/pins", {"scope": "default", "targetKind": "peer", "targetPeerId": node.peer_id("hub-b")})
        b_uuid = b.op("GET", "/status")["localNode"]["identity"]["nodeUuid"]
        seen: list[tuple[str, dict | None]] = []
        stop = threading.Event()

        def sample() -> None:
            for _ in range(600):  # bounded: 600 x 100 ms
                if stop.is_set():
                    return
                for name, node in (("hub-a", a), ("hub-c", c)):
                    peer = next(p for p in node.op("GET", "/status")["peers"] if p["nodeFqdn"] == fqdn("hub-b"))
                    seen.append((name, peer["probeFailure"]))
                time.sleep(0.1)

        def captured(name: str) -> dict[str, str]:
            kp = _keypair_of(rig.nodes[name])
            return signing.sign_headers(kp, "GET", P + "/capabilities", kp.node_uuid, fqdn(name), b_uuid, None,
                                        now_ms=signing._now_ms() - LAGS_MS[name])  # noqa: SLF001

        def back_in_view(when: str) -> None:
            """A killed node's peers may have polled it while it was down (unreachable, no
            back-off: the sampler checks that); within three 1 s polls of its restart each
            reads it connected and offering the model again."""
            deadline = time.monotonic() + 3.5
            while True:
                views = {name: next(p for p in node.op("GET", "/status")["peers"] if p["nodeFqdn"] == fqdn("hub-b"))
                         for name, node in (("hub-a", a), ("hub-c", c))}
                if all(v["status"] == "connected" and any(
                        be.get("healthy") and MODEL in (be.get("modelsLoaded") or [])
                        for be in (v.get("lastCapabilities") or {}).get("backends") or []) for v in views.values()):
                    return
                assert time.monotonic() < deadline, (when, {n: (v["status"], v["probeFailure"]) for n, v in views.items()})
                time.sleep(0.1)

        def served_by_b(when: str) -> int:
            back_in_view(when)
            with httpx.Client(timeout=15, trust_env=False) as client:
                for name, node in (("hub-a", a), ("hub-c", c)):
                    for i in range(3):
                        r = client.post(node.url + "/api/chat", json=chat_body("/api/chat", f"{when} {i}", False))
                        assert r.status_code == 200, (when, name, r.text)
                        assert r.headers["x-hub-pool-served-by"] == fqdn("hub-b"), (when, name, r.headers)
            return 6

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            first = captured("hub-a")
            assert httpx.get(b.url + P + "/capabilities", headers=first).status_code == 200
            time.sleep(1.5)  # a health tick records each peer's clock offset
            b.stop()  # SIGTERM: a clean shutdown
            b.start(ready_timeout=60)  # a loaded 2-core box can take 15 s to import and boot
            clean_replay = httpx.get(b.url + P + "/capabilities", headers=first)
            served = served_by_b("after SIGTERM")
            # hub-a's, not hub-c's: a 290 s-old signature would be past the window by the time
            # a loaded box has restarted, and refused as expired, which proves nothing here
            second = captured("hub-a")
            assert httpx.get(b.url + P + "/capabilities", headers=second).status_code == 200
            time.sleep(1.5)
            b.kill()  # SIGKILL: no shutdown of any kind
            b.start(ready_timeout=60)
            crash_replay = httpx.get(b.url + P + "/capabilities", headers=second)
            served += served_by_b("after SIGKILL")
            time.sleep(2.5)  # two more polls each, sampled
        finally:
            stop.set()
            sampler.join(10)
        refusals = [(name, f) for name, f in seen if f and (f["kind"] != "unreachable" or f["nextProbeAt"])]
        assert not refusals, refusals
        assert clean_replay.status_code == 401, clean_replay.text
        assert crash_replay.status_code == 503 and crash_replay.headers.get("retry-after"), crash_replay.text
        inbound = [x for x in rig.log("hub-b") if x["direction"] == "inbound" and (x["status"] or 0) >= 400]
        assert not inbound, inbound
        report("F10-processes", {"lagsMs": LAGS_MS, "cleanReplay": clean_replay.status_code,
                                 "crashReplay": crash_replay.status_code, "servedByRestartedNode": served,
                                 "statusSamples": len(seen), "backedOff": 0})
