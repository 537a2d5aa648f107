"""Issue 9 part 5: the pairing PIN under 50 concurrent guesses (NIST 800-63B's attempt limit),
and a peer whose database was recreated (OpenSSH's refusal of a changed host key): it gets
zero requests routed to it."""

from __future__ import annotations

import shutil
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from harness import RunningNode, fqdn, make_pool

from hubpool_core.peering.pairing_pin import PAIRING_PIN_MAX_ATTEMPTS
from hubpool_sim import SimConfig, SimModel, run_in_thread

P = "/api/inference/pool"


def _mint(node) -> tuple[str, object]:
    with node.client(headers=node.headers()) as c:
        pin = c.post(P + "/pairing-pin").json()["pin"]
    return pin, node.node.pairing_pin._active  # kept: its attempt counter outlives the PIN


def _guess(node, i: int, pin: str, barrier: threading.Barrier) -> httpx.Response:
    body = {"fromNodeFqdn": f"guess-{i:02d}.example-tailnet.ts.net", "token": f"{i:064d}", "pin": pin}
    # A forwarded-for hop makes the caller's IP untrustworthy, so the per-IP cooldown cannot
    # key on it: only the PIN's own attempt ceiling stands between 50 sources and the digits.
    barrier.wait(10)
    return httpx.post(node.url + P + "/pair/request", json=body, headers={"X-Forwarded-For": f"198.51.100.{i}"},
                      timeout=20)


@pytest.fixture
def lone(tmp_path):
    node = make_pool(tmp_path, ["hub-b"])["hub-b"].start()
    yield node
    node.stop()


@pytest.mark.parametrize("right_at", [None, 0, 17, 49, "all"])
def test_fifty_concurrent_guesses(lone, right_at):
    pin, active = _mint(lone)
    wrong = [f"{(int(pin) + 1 + k) % 1_000_000:06d}" for k in range(50)]
    guesses = [pin if right_at in (i, "all") else wrong[i] for i in range(50)]
    barrier = threading.Barrier(50)
    with ThreadPoolExecutor(50) as ex:
        answers = list(ex.map(lambda i: _guess(lone, i, guesses[i], barrier), range(50)))
    ok = [r for r in answers if r.status_code == 200]
    failed = [r for r in answers if r.status_code != 200]
    assert len(ok) <= 1
    if ok:
        assert right_at is not None and "nodeFqdn" in ok[0].json()
    wrong_evaluated = active.attempts - len(ok)
    print(f"PIN right_at={right_at}: {len(ok)} success, {wrong_evaluated} wrong evaluated, {len(failed)} refused")
    assert wrong_evaluated <= PAIRING_PIN_MAX_ATTEMPTS, active.attempts
    assert {r.status_code for r in failed} == {401}
    assert len({r.content for r in failed}) == 1  # byte-identical: wrong, used, destroyed alike
    assert failed[0].json() == {"error": "Invalid or expired pairing PIN"}
    assert len({tuple(sorted((k, v) for k, v in r.headers.items() if k not in ("date",))) for r in failed}) == 1
    # exactly the successful guess left a (pending) row; the PIN is gone either way
    assert len(lone.node.peers.all()) == len(ok)
    assert lone.node.pairing_pin._active is None or (not ok and active.attempts < PAIRING_PIN_MAX_ATTEMPTS)
    if right_at is None:
        assert active.attempts == PAIRING_PIN_MAX_ATTEMPTS and lone.node.pairing_pin._active is None
    if right_at == "all":  # single use under a race: exactly one of 50 identical right guesses wins
        assert len(ok) == 1 and active.attempts == 1


# ── A peer whose database was recreated ──────────────────────────────────────


def _rebind(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return sock


def _inbound(node) -> list[dict]:
    return [r for r in node.node.routing_log.query(limit=10_000)["entries"] if r["direction"] == "inbound"]


def _chat(node, model="only-b:1b"):
    return httpx.post(node.url + "/v1/chat/completions", timeout=30,
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}]})


def test_a_peer_whose_database_was_recreated_gets_zero_requests(tmp_path):
    cfg = SimConfig(flavor="ollama", models=[SimModel("only-b:1b", window=4096)])
    with run_in_thread(cfg) as sim:
        nodes = make_pool(tmp_path, ["hub-a", "hub-b"], per_node={"hub-b": {"OLLAMA_URL": sim.url}})
        a, b = nodes["hub-a"].start(), nodes["hub-b"].start()
        try:
            with b.client(headers=b.headers()) as c:
                pin = c.post(P + "/pairing-pin").json()["pin"]
            with a.client(headers=a.headers()) as c:
                assert c.post(P + "/peers/pair", json={"nodeFqdn": fqdn("hub-b"), "pin": pin}).status_code == 200
            with b.client(headers=b.headers()) as c:
                assert c.post(f"{P}/peers/{fqdn('hub-a')}/approve").status_code == 200
            for _ in range(2):
                a.run(a.node.health.poll_once())
                b.run(b.node.health.poll_once())
            assert _chat(a).status_code == 200  # routed to hub-b while it is the node A paired with
            served = sim.server.engine.stats.by_model["only-b:1b"]
            assert served >= 1

            # hub-b's database is recreated: same name, same address, a new identity
            port, environ, data_dir = b.port, dict(b.environ), b.env.data_dir
            b.stop()
            shutil.rmtree(data_dir)
            environ.pop("HUB_POOL_LISTEN")
            b = RunningNode(data_dir, environ, sock=_rebind(port)).start()
            assert b.node.identity.get().node_uuid != a.node.peers.by_fqdn(fqdn("hub-b")).peer_node_uuid

            # before A's next poll, a forward reaches B's guard only, and is refused there
            first = _chat(a)
            assert first.status_code == 502, first.text
            assert sim.server.engine.stats.by_model["only-b:1b"] == served
            a.run(a.node.health.poll_once())  # the probe meets identity-mismatch: out at once
            row = a.node.peers.by_fqdn(fqdn("hub-b"))
            assert row.status == "unreachable"
            assert a.node.health.failures[row.id].kind == "identity_changed"
            refused_at_b = _inbound(b)
            assert [(r["status"], r["outcome"]) for r in refused_at_b] == [(401, "failed")]
            for _ in range(10):
                assert _chat(a).status_code == 502
            assert sim.server.engine.stats.by_model["only-b:1b"] == served  # zero reached the engine
            assert _inbound(b) == refused_at_b  # and not one more request reached hub-b at all
        finally:
            a.stop()
            b.stop()
