"""A defect F1 found, made deterministic: a peer's engine dies right after sending its response
headers. The peer (the leaf) has committed the 200 to the sending node and ends its reply with
no body at all; the sending node's output check saw no frame, took the empty stream as "not
recognisably in the dialect", and logged the request served — while the app got a 200 with no
answer. An empty stream lacks its final frame like any other cut stream: the row must say
failed / truncated-upstream (StreamJudge.verdict, hubpool_core/proxy/output_check.py).

Since issue 28 item 1 the sending node commits a stream at its first real token, so an empty
stream never reaches the app at all: it is passed over like a missing header, and with no other
candidate the app gets the walk's 502 naming the cut, never a 200 with nothing in it."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from harness import fqdn, make_pool, pair
from history import History, run_op
from raw_http import RawHttpServer, read_request, send_json

MODEL = "llama3.2:3b"
P = "/api/inference/pool"


class HeadersThenDies(RawHttpServer):
    """A raw-socket Ollama: /api/tags lists the model; a chat gets 200 headers (chunked) and then
    the connection closes with no body and no terminator, as when the engine dies right there."""

    def __init__(self) -> None:
        self.chats = 0
        super().__init__()

    def handle(self, conn: socket.socket, serial: int) -> None:
        got = read_request(conn)
        if got is None:
            return
        path, _body = got
        if path == b"/api/tags":
            send_json(conn, {"models": [{"name": MODEL, "model": MODEL}]}, close=True)
            return
        if path in (b"/api/chat", b"/v1/chat/completions"):
            self.chats += 1
            ctype = b"application/x-ndjson" if path == b"/api/chat" else b"text/event-stream"
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n\r\n" % ctype)
            time.sleep(0.2)  # the headers have left; then the engine is gone
            return
        conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


@pytest.mark.parametrize("route", ["/api/chat", "/v1/chat/completions"])
def test_a_peer_stream_that_ends_empty_after_headers_is_logged_truncated(tmp_path, route):
    sim = HeadersThenDies()
    try:
        nodes = make_pool(tmp_path, ["hub-a", "hub-b"], per_node={"hub-b": {"OLLAMA_URL": sim.url}})
        a, b = nodes["hub-a"].start(), nodes["hub-b"].start()  # hub-a has no engine of its own
        try:
            pair(a, b)
            deadline = time.monotonic() + 20
            while not any(MODEL in m for bk in ((next(p for p in httpx.get(
                    a.url + P + "/peers", headers=a.headers()).json())).get("lastCapabilities") or {}).get(
                    "backends", []) for m in bk["modelsLoaded"]):
                assert time.monotonic() < deadline
                a.run(a.node.health.poll_once())
            history = History()
            with httpx.Client(timeout=15, trust_env=False) as c:
                op = run_op(c, history, "hub-a", a.url, route,
                            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True})
            assert op.status == 502 and op.served_by is None and op.tokens == 0 and not op.final, op.brief()
            assert "truncated-upstream (the stream ended before its first token)" in op.error, op.brief()
            with a.client(headers=a.headers()) as c:
                row = next(r for r in c.get(P + "/routing-log").json()["entries"] if r["id"] == op.rid)
            assert row["outcome"] == "failed" and row["status"] == 502 and row["node"] == fqdn("hub-b"), row
            assert row["reason"].startswith("truncated-upstream"), row
            with b.client(headers=b.headers()) as c:  # the leaf relayed at once: its inbound row says the cut
                leaf = next(r for r in c.get(P + "/routing-log").json()["entries"] if r["id"] == op.rid)
            assert leaf["outcome"] == "failed" and "truncated-upstream" in (leaf["reason"] or ""), leaf
            assert sim.chats == 1
        finally:
            a.stop()
            b.stop()
    finally:
        sim.close()
