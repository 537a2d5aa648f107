"""One peer that never answers must not hold back the others' polls (the health half of N1's
partition scenario, tests/fault/test_n1_partitions.py, in the fast lane).

A tick used to probe every peer in one ``gather`` and the loop waited for it, so a peer whose
packets a partition drops (nothing fails until the timeout) held every other peer's poll for the
whole 15 s. Each probe is now its own task under a budget of at most two polls, and a peer
whose probe is still waiting is not probed twice. The silent peer here is a socket whose
kernel completes the connection and whose server never reads a byte: what a hung peer is."""

from __future__ import annotations

import socket
import threading
import time

from harness import fqdn, make_pool, pair, wait_until


class SilentPeer:
    """Accepts connections, counts them, answers nothing."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self.accepted:
            c.close()


def test_a_silent_peer_holds_back_no_other_peers_poll(tmp_path):
    # polls every 60 s: the loop's own ticks stay out of the way, the test drives each tick;
    # the probe budget is min(15 s, two polls) = 15 s here, so the silent probe stays in flight
    nodes = make_pool(tmp_path, ["hub-a", "hub-b", "hub-c"], environ={"HUB_POOL_DEV_HEALTH_POLL_SECONDS": "60"})
    for n in nodes.values():
        n.start()
    silent = SilentPeer()
    try:
        a = nodes["hub-a"]
        pair(a, nodes["hub-b"])
        pair(a, nodes["hub-c"])
        health = a.node.health
        a.run(health.poll_once())  # both answer: a clean start
        rows = {r.node_fqdn: r for r in a.node.peers.all()}
        b_id, c_id = rows[fqdn("hub-b")].id, rows[fqdn("hub-c")].id
        seen_b = rows[fqdn("hub-b")].last_seen_at
        a.node.peer_urls[fqdn("hub-c")] = silent.url  # hub-c now hangs

        t0 = time.monotonic()
        a.run(health._loop.step(), timeout=20)  # noqa: SLF001 - exactly what the loop runs each tick
        tick_s = time.monotonic() - t0
        assert tick_s < 2.0, f"a tick waited {tick_s:.1f}s for its probes"
        # hub-b's probe completes while hub-c's is still waiting
        assert wait_until(lambda: a.node.peers.by_id(b_id).last_seen_at != seen_b, timeout=5)
        assert wait_until(lambda: len(silent.accepted) == 1, timeout=5)
        assert c_id in health._probes and not health._probes[c_id].done()  # noqa: SLF001
        # a second tick probes hub-b again and leaves hub-c's waiting probe alone
        seen_b = a.node.peers.by_id(b_id).last_seen_at
        a.run(health._loop.step(), timeout=20)  # noqa: SLF001
        assert wait_until(lambda: a.node.peers.by_id(b_id).last_seen_at != seen_b, timeout=5)
        time.sleep(0.2)
        assert len(silent.accepted) == 1, len(silent.accepted)
        assert a.node.peers.by_id(c_id).consecutive_failures == 0  # nothing has failed yet
    finally:
        silent.close()
        for n in nodes.values():
            n.stop()


def test_the_probe_budget_is_two_polls_at_most(tmp_path):
    nodes = make_pool(tmp_path, ["hub-a", "hub-b"], environ={"HUB_POOL_DEV_HEALTH_POLL_SECONDS": "1"})
    for n in nodes.values():
        n.start()
    silent = SilentPeer()
    try:
        a = nodes["hub-a"]
        pair(a, nodes["hub-b"])
        assert a.node.health.probe_timeout_s == 2.0
        a.node.peer_urls[fqdn("hub-b")] = silent.url
        b_id = a.node.peers.all()[0].id
        # the loop ticks every second: the first strike comes when the first silent probe's 2 s run out
        t0 = time.monotonic()
        assert wait_until(lambda: a.node.peers.by_id(b_id).consecutive_failures >= 1, timeout=10)
        assert time.monotonic() - t0 < 4.5
        assert a.node.health.failures[b_id].detail == "no answer within 2s", a.node.health.failures[b_id]
    finally:
        silent.close()
        for n in nodes.values():
            n.stop()
