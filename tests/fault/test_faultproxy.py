"""The fault proxy's toxics do what they say, on raw sockets: reset is an RST after exactly N
bytes, close a FIN after exactly N bytes, blackhole passes nothing and closes nothing, latency
delays, and the slicer delivers one byte per write; a toxic claims only the connections it
matches and only as many as its count."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from faultproxy import FaultProxy, Toxic

BODY = bytes(range(256)) * 4  # 1024 bytes


class OneShotServer:
    """Reads a request line, answers BODY, closes; every connection in its own thread."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(5)
                conn.recv(4096)
                conn.sendall(BODY)
            except OSError:
                pass

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture
def proxy():
    server = OneShotServer()
    p = FaultProxy(server.port).start()
    yield p
    p.stop()
    server.close()


def fetch(proxy: FaultProxy, request: bytes = b"GET /local/x HTTP/1.1\r\n\r\n", timeout: float = 3.0):
    """(bytes received, how it ended: eof | reset | timeout, recv calls, seconds)."""
    s = socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)
    s.sendall(request)
    got, calls, t0 = b"", 0, time.monotonic()
    try:
        while True:
            chunk = s.recv(65536)
            calls += 1
            if not chunk:
                return got, "eof", calls, time.monotonic() - t0
            got += chunk
    except ConnectionResetError:
        return got, "reset", calls, time.monotonic() - t0
    except socket.timeout:
        return got, "timeout", calls, time.monotonic() - t0
    finally:
        s.close()


def test_no_toxic_passes_everything(proxy):
    assert fetch(proxy)[:2] == (BODY, "eof")


def test_reset_after_n_bytes_is_an_rst_after_exactly_n(proxy):
    proxy.arm(Toxic("reset", nbytes=300))
    got, how, _, _ = fetch(proxy)
    assert (got, how) == (BODY[:300], "reset")


def test_close_after_n_bytes_is_a_fin_after_exactly_n(proxy):
    proxy.arm(Toxic("close", nbytes=300))
    assert fetch(proxy)[:2] == (BODY[:300], "eof")


def test_blackhole_passes_nothing_and_closes_nothing(proxy):
    proxy.arm(Toxic("blackhole"))
    got, how, _, took = fetch(proxy, timeout=1.0)
    assert (got, how) == (b"", "timeout") and took >= 0.9


def test_blackhole_after_n_bytes_goes_silent_after_them(proxy):
    proxy.arm(Toxic("blackhole", nbytes=100))
    got, how, _, _ = fetch(proxy, timeout=1.0)
    assert (got, how) == (BODY[:100], "timeout")


def test_latency_delays_the_answer(proxy):
    proxy.arm(Toxic("latency", ms=400))
    got, how, _, took = fetch(proxy)
    assert (got, how) == (BODY, "eof") and took >= 0.4


def test_slicer_delivers_one_byte_per_write(proxy):
    proxy.arm(Toxic("slicer", ms=1))
    got, how, calls, _ = fetch(proxy)
    assert (got, how) == (BODY, "eof") and calls >= 200  # many tiny segments, not one


def test_a_toxic_claims_only_matching_connections_and_only_count_of_them(proxy):
    proxy.arm(Toxic("reset", nbytes=10, count=1))
    assert fetch(proxy, b"GET /api/inference/pool/capabilities HTTP/1.1\r\n\r\n")[:2] == (BODY, "eof")
    assert fetch(proxy)[:2] == (BODY[:10], "reset")
    assert fetch(proxy)[:2] == (BODY, "eof")  # its count is spent
    assert [r.toxic for r in proxy.records] == [None, "reset", None]
