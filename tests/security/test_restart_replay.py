"""A crash shortly after a peer's clock stepped back replays nothing (issue 26 item 26).

After a crash a node judges each peer by a watermark of its own, ``start − offset``, where the
offset is the smallest ``receipt − timestamp`` the peer's accepted requests showed, as the last
health tick wrote it. Until issue 26 that offset was the smallest of the last two ticks only: a
peer whose clock stepped back by two minutes (so its offset grew by 120 s) had the smaller,
older offset forgotten after two ticks, the watermark moved 120 s back, and a request it had
sent just before the step, still inside its 300 s window, could be replayed once after the crash.
Now the offset is the smallest over every accepted request that could still be replayed.

hub-a signs with its real key; its clock is shifted where it signs (``now_ms``), as F10 does.
The crash is the disk as hub-b's last health-tick work left it (a kill leaves no clean record).
"""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest
from harness import RunningNode, fqdn, make_pool, pair

from hubpool_core.peering import signing

P = "/api/inference/pool"
NONCE_FILE = "peer-nonces.json"
STEP_MS = 120_000  # hub-a's clock steps back by two minutes


def _signed(a: RunningNode, b: RunningNode, behind_ms: int) -> dict[str, str]:
    kp = a.node.identity.get()
    return signing.sign_headers(kp, "GET", P + "/capabilities", kp.node_uuid, fqdn("hub-a"),
                                b.node.identity.get().node_uuid, None,
                                now_ms=signing._now_ms() - behind_ms)  # noqa: SLF001 - the suite's clock


def _crash_and_start(b: RunningNode, image: bytes) -> RunningNode:
    """hub-b as a kill leaves it: its data directory holding only what the last tick wrote."""
    port = b.port
    b.stop()
    (Path(b.env.data_dir) / NONCE_FILE).write_bytes(image)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return RunningNode(b.env.data_dir, b.environ, sock=sock).start()


@pytest.fixture
def pool(tmp_path):
    nodes = make_pool(tmp_path, ["hub-a", "hub-b"])
    a, b = nodes["hub-a"].start(), nodes["hub-b"].start()
    pair(a, b)
    for node in (a, b):
        node.run(node.node.health.stop())  # the test runs hub-b's tick work itself
    yield a, b
    a.stop()
    b.stop()  # the first process (the test stops the one it restarts)


def test_a_request_sent_before_a_clock_step_back_is_not_replayed_after_a_crash(pool):
    a, b = pool
    before_step = _signed(a, b, 0)
    assert httpx.get(b.url + P + "/capabilities", headers=before_step, timeout=30).status_code == 200
    # hub-a's clock steps back; it keeps talking to hub-b, which runs three ticks meanwhile
    for _ in range(3):
        r = httpx.get(b.url + P + "/capabilities", headers=_signed(a, b, STEP_MS), timeout=30)
        assert r.status_code == 200, r.text
        b.node.housekeeping()  # the tick's work: writes each peer's offset (peering/nonce_file.py)
    image = (Path(b.env.data_dir) / NONCE_FILE).read_bytes()
    b = _crash_and_start(b, image)
    try:
        replay = httpx.get(b.url + P + "/capabilities", headers=before_step, timeout=30)
        assert replay.status_code == 503 and replay.headers.get("retry-after"), (replay.status_code, replay.text)
        # what is refused is only what hub-b cannot judge: hub-a signing with its clock set right
        fresh = httpx.get(b.url + P + "/capabilities", headers=_signed(a, b, 0), timeout=30)
        assert fresh.status_code == 200, fresh.text
    finally:
        b.stop()
