"""The keep-alive race: an engine closes an idle kept-alive connection just as the relay reuses
it, so the request dies before any byte of an answer (aiohttp: ServerDisconnectedError or
ClientOSError). With one candidate that was a 502 for a request the engine never saw. The
relay now sends such an attempt once more on a fresh connection — only when the connection
was a reused one and nothing of an answer had arrived (hubpool_core/proxy/attempt.py,
send_attempt).

The engine here is a raw-socket Ollama with a short keep-alive. On the wire the race is a
matter of microseconds (the server's FIN crossing the client's request); to make it happen on
every run this engine holds its idle close until the next request arrives, then closes without
answering — exactly what the relay sees when it loses the race."""

from __future__ import annotations

import socket
import threading
import time

import httpx
from harness import RunningNode
from raw_http import RawHttpServer, read_request, send_json

MODEL = "llama3.2:3b"
KEEP_ALIVE_S = 0.3


class ShortKeepAliveEngine(RawHttpServer):
    """Ollama on raw sockets. `mode` says what happens to a chat on a connection that has been
    idle past the keep-alive: "close" (the race: closed unanswered), "partial" (closed after the
    first bytes of a status line). `refuse_fresh` closes every chat unanswered, even on a new
    connection."""

    def __init__(self, mode: str = "close", refuse_fresh: bool = False) -> None:
        self.mode, self.refuse_fresh = mode, refuse_fresh
        self.lock = threading.Lock()
        self.chat_connections: set[int] = set()  # ids of the connections a chat arrived on
        self.chats_received = 0
        self.chats_answered = 0
        self.dropped_on_reuse = 0
        super().__init__(backlog=64, thread_per_connection=True)

    def handle(self, conn: socket.socket, serial: int) -> None:
        # one connection, kept alive across requests
        answered_at: float | None = None
        while not self.closing.is_set():
            try:
                got = read_request(conn)
            except OSError:
                return
            if got is None:
                return
            path, _body = got
            if path == b"/api/tags":
                send_json(conn, {"models": [{"name": MODEL, "model": MODEL}]})
                answered_at = time.monotonic()
                continue
            if path != b"/api/chat":
                conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                answered_at = time.monotonic()
                continue
            with self.lock:
                self.chats_received += 1
                self.chat_connections.add(serial)
            expired = answered_at is not None and time.monotonic() - answered_at >= KEEP_ALIVE_S
            if self.refuse_fresh or expired:
                with self.lock:
                    self.dropped_on_reuse += expired
                if self.mode == "partial" and expired:
                    conn.sendall(b"HTTP/1.1 2")
                return  # closed unanswered (the with block closes the socket)
            with self.lock:  # counted before the answer leaves: the test reads it once the answer arrived
                self.chats_answered += 1
            send_json(conn, {"model": MODEL, "message": {"role": "assistant", "content": "hi"},
                              "done": True, "done_reason": "stop"})
            answered_at = time.monotonic()


def _chat(node: RunningNode) -> httpx.Response:
    with node.client() as c:
        return c.post("/api/chat", headers=node.headers(),
                      json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": False})


def _row(node: RunningNode, rid: str) -> dict:
    with node.client(headers=node.headers()) as c:
        return next(r for r in c.get("/api/inference/pool/routing-log").json()["entries"] if r["id"] == rid)


def test_an_engine_closing_a_reused_idle_connection_is_retried_once_on_a_fresh_one(tmp_path):
    engine = ShortKeepAliveEngine()
    try:
        with RunningNode(tmp_path / "a", {"OLLAMA_URL": engine.url}) as node:
            first = _chat(node)
            assert first.status_code == 200, first.text
            time.sleep(KEEP_ALIVE_S + 0.2)  # the relay's pooled connection is now past the engine's keep-alive
            second = _chat(node)
            assert second.status_code == 200, second.text
            assert second.json()["message"]["content"] == "hi"
            assert (engine.chats_received, engine.dropped_on_reuse, engine.chats_answered) == (3, 1, 2)
            assert len(engine.chat_connections) == 2  # the retry went out on a new connection
            row = _row(node, second.headers["x-hub-pool-request-id"])
            assert (row["outcome"], row["status"], row["attempt"], row["failedOverFrom"]) == ("served", 200, 1, [])
    finally:
        engine.close()


def test_a_fresh_connection_closed_before_an_answer_is_not_retried(tmp_path):
    engine = ShortKeepAliveEngine(refuse_fresh=True)
    try:
        with RunningNode(tmp_path / "a", {"OLLAMA_URL": engine.url}) as node:
            answer = _chat(node)
            assert answer.status_code == 502, answer.text
            assert "fetch failed" in answer.json()["error"]
            assert engine.chats_received == 1  # the engine may have seen it: it is not sent twice
            row = _row(node, answer.headers["x-hub-pool-request-id"])
            assert row["outcome"] == "failed" and row["status"] == 502
    finally:
        engine.close()


def test_a_reused_connection_closed_after_part_of_an_answer_is_not_retried(tmp_path):
    engine = ShortKeepAliveEngine(mode="partial")
    try:
        with RunningNode(tmp_path / "a", {"OLLAMA_URL": engine.url}) as node:
            assert _chat(node).status_code == 200
            time.sleep(KEEP_ALIVE_S + 0.2)
            answer = _chat(node)
            assert answer.status_code == 502, answer.text
            assert (engine.chats_received, engine.dropped_on_reuse) == (2, 1)
    finally:
        engine.close()
