"""A stranger's body, at every door a stranger can reach (issue 26 item 1).

``/pair/request`` answers anyone; ``/pair/confirm``, ``/pair/reject``, ``/pair/unpair``,
``/pair/upgrade`` and ``GET /capabilities`` read their body before the peer guard (the
signature covers it); ``POST /ui/signin`` answers anyone. Each must refuse a body over its
limit before reading it: on the declared ``Content-Length``, and, for a chunked body, as soon
as the bytes read pass the limit. Until issue 26 each buffered the whole body first, so a
declared 256 MiB was waited for (and held) before the 413.

The proof here is the clock-free one: the test sends the headers and only part of the body,
then waits for the answer. A route that reads first would wait for the rest, which never
comes, and the socket's timeout fails the test; a route that refuses first answers 413 at
once. The memory a 256 MiB body costs a node process is measured in test_stranger_memory.py.
"""

from __future__ import annotations

import socket

import pytest
from harness import make_pool

P = "/api/inference/pool"
#: (method, path, limit): every door a stranger reaches with a body, and what it accepts
DOORS = [
    ("POST", P + "/pair/request", 65_536),
    ("POST", P + "/pair/confirm", 65_536),
    ("POST", P + "/pair/reject", 65_536),
    ("POST", P + "/pair/unpair", 65_536),
    ("POST", P + "/pair/upgrade", 65_536),
    ("GET", P + "/capabilities", 65_536),
    ("POST", "/ui/signin", 8_192),
]
#: how long the test waits for an answer a refusing route gives at once (a loaded box is slow)
ANSWER_WITHIN_S = 20


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = make_pool(tmp_path_factory.mktemp("stranger"), ["hub-a"])["hub-a"].start()
    yield n
    n.stop()


def _head(method: str, path: str, port: int, framing: str) -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"{framing}\r\n\r\n").encode()


def _answer(sock: socket.socket) -> tuple[int, bytes]:
    """The answer's status and its bytes (head and body, by its Content-Length)."""
    sock.settimeout(ANSWER_WITHIN_S)
    raw = b""

    def complete() -> bool:
        head, sep, body = raw.partition(b"\r\n\r\n")
        if not sep:
            return False
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        return len(body) >= length

    while not complete():
        try:
            chunk = sock.recv(65_536)
        except TimeoutError:
            raise AssertionError(f"no answer within {ANSWER_WITHIN_S}s: the route is waiting for the rest of "
                                 "the body instead of refusing it") from None
        if not chunk:
            break
        raw += chunk
    assert raw.startswith(b"HTTP/1.1 "), raw[:200]
    return int(raw.split(b" ", 2)[1]), raw


@pytest.mark.parametrize(("method", "path", "limit"), DOORS, ids=[p for _, p, _ in DOORS])
def test_a_declared_length_over_the_limit_is_refused_before_the_body_is_read(node, method, path, limit):
    with socket.create_connection(("127.0.0.1", node.port)) as sock:
        sock.sendall(_head(method, path, node.port, f"Content-Length: {256 * 1024 * 1024}") + b'{"x": "')
        status, raw = _answer(sock)
    assert status == 413, raw[:300]
    assert str(limit).encode() in raw  # the sentence says what the route accepts


@pytest.mark.parametrize(("method", "path", "limit"), DOORS, ids=[p for _, p, _ in DOORS])
def test_a_chunked_body_is_refused_once_it_passes_the_limit(node, method, path, limit):
    """No terminating chunk is ever sent: only a route that stops at its limit can answer."""
    piece = b"x" * 4096
    with socket.create_connection(("127.0.0.1", node.port)) as sock:
        sock.sendall(_head(method, path, node.port, "Transfer-Encoding: chunked"))
        for _ in range(limit // len(piece) + 2):
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        status, raw = _answer(sock)
    assert status == 413, raw[:300]


@pytest.mark.parametrize("declared", ["²", "-1", "1e9", " 70000 ", "99999999999999999999999"])
def test_a_strange_content_length_is_no_crash(node, declared):
    """What the server lets through as a Content-Length is judged as digits or not at all:
    never a 500 (``"²".isdigit()`` is True and ``int("²")`` raises)."""
    with socket.create_connection(("127.0.0.1", node.port)) as sock:
        sock.sendall(_head("POST", P + "/pair/request", node.port, f"Content-Length: {declared}") + b"{}")
        sock.shutdown(socket.SHUT_WR)
        status, raw = _answer(sock)
    assert status in (400, 413), raw[:300]  # the server's own 400 for a malformed header, or the limit


def test_a_body_within_the_limit_still_reaches_the_route(node):
    """The limit is the limit: a pairing request just under it is judged on its content."""
    import httpx

    body = b'{"fromNodeFqdn": "hub-x.example-tailnet.ts.net", "pad": "' + b"p" * 60_000 + b'"}'
    r = httpx.post(node.url + P + "/pair/request", content=body, timeout=30,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "token" in r.json()["error"], r.text  # read, parsed, judged
    chunked = httpx.post(node.url + P + "/pair/request", content=iter([body[:30_000], body[30_000:]]), timeout=30)
    assert chunked.status_code == 400 and "token" in chunked.json()["error"], chunked.text
