"""A raw-socket HTTP server for tests that need an engine to misbehave below what an HTTP
framework allows: die after its headers, skip the chunked terminator, close a kept-alive
connection as it is reused. Loopback only; a thread accepts, ``close()`` stops it."""

from __future__ import annotations

import json
import socket
import threading


def read_request(conn: socket.socket) -> tuple[bytes, bytes] | None:
    """(path, body) of the next request on ``conn``, or None if the client closed first."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        chunk = conn.recv(65536)
        if not chunk or len(raw) > 65536:
            return None
        raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        body += chunk
    return head.split(b" ", 2)[1], body


def send_json(conn: socket.socket, obj: dict, *, close: bool = False) -> None:
    """A whole 200 JSON answer (``close`` adds Connection: close)."""
    body = json.dumps(obj).encode()
    extra = b"Connection: close\r\n" if close else b""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s"
                 % (extra, len(body), body))


class RawHttpServer:
    """Accepts on an ephemeral loopback port and hands each connection to :meth:`handle`,
    inline (one connection at a time) or, with ``thread_per_connection``, on a thread of its
    own. The connection is closed when ``handle`` returns; socket errors end it quietly."""

    def __init__(self, *, backlog: int = 16, thread_per_connection: bool = False) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(backlog)
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.closing = threading.Event()
        self.thread_per_connection = thread_per_connection
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def handle(self, conn: socket.socket, serial: int) -> None:
        """Answer one connection (the ``serial``-th accepted)."""
        raise NotImplementedError

    def _accept(self) -> None:
        serial = 0
        while not self.closing.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            serial += 1
            if self.thread_per_connection:
                threading.Thread(target=self._run, args=(conn, serial), daemon=True).start()
            else:
                self._run(conn, serial)

    def _run(self, conn: socket.socket, serial: int) -> None:
        with conn:
            conn.settimeout(10 if self.thread_per_connection else 5)
            try:
                self.handle(conn, serial)
            except OSError:
                pass

    def close(self) -> None:
        self.closing.set()
        self.thread.join(5)
        self.sock.close()
