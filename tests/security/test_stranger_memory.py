"""What a stranger's bytes cost a node process, measured (issue 26 items 1 and 2).

A `hubpool serve` process, and a stranger on the same network who is not paired and holds no
key. The figures are the kernel's: the process's peak resident set (``VmHWM``) and its resident
set now (``VmRSS``), from /proc, before and after. Memory, not time: no clock is asserted.

- 256 MiB sent to each stranger door (declared, and chunked with no length) may grow the peak
  by at most 64 MB. Before issue 26, one 256 MiB body to ``/pair/request`` grew it by 512 MB.
- Forty refused ``/local/*`` requests each carrying an 8 MB ``X-Hub-Pool-Model`` may leave at
  most 64 MB more resident once answered, and the routing log holds no string over 300
  characters. Before issue 26 they took a node from 94 MB to 424 MB, all of it held in the log.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import httpx
import pytest
from harness import tailnet_status_for
from process_harness import NodeProcess, free_port

P = "/api/inference/pool"
MIB = 1024 * 1024
BODY_MIB = 256
GROWTH_BOUND_MB = 64


def _status(pid: int) -> dict[str, int]:
    """VmHWM and VmRSS of ``pid``, in kB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmHWM", "VmRSS"):
            out[name] = int(value.split()[0])
    return out


def _report(name: str, figures: dict) -> None:
    """The measured figures, printed (``-s`` shows them; docs/reliability.md quotes a run)."""
    print(f"\n{name}: {json.dumps(figures)}")


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    root = tmp_path_factory.mktemp("memory")
    status = root / "hub-a-tailscale.json"
    status.write_text(json.dumps(tailnet_status_for("hub-a")))
    proc = NodeProcess("hub-a", root, free_port(), {"HUB_POOL_TAILSCALE_CLI": str(status)}).start(ready_timeout=60)
    yield proc
    proc.stop()


def _send(port: int, method: str, path: str, mib: int, chunked: bool) -> int | None:
    """Send ``mib`` MiB as one request's body; the answer's status, or None when the node
    closed the connection before answering (it never does here, but a stranger would not care)."""
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {mib * MIB}"
    piece = b"7" * MIB
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(120)
        sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\n{framing}\r\n\r\n".encode())
        try:
            for _ in range(mib):
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            if chunked:
                sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        raw = b""
        try:
            while b"\r\n" not in raw:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                raw += chunk
        except (ConnectionResetError, TimeoutError):
            return None
    return int(raw.split(b" ", 2)[1]) if raw.startswith(b"HTTP/1.1 ") else None


def test_a_stranger_sending_256_mib_grows_the_node_by_at_most_64_mb(node):
    # warm: every code path of a refusal has run once, so what follows measures the bodies
    for path, method in ((P + "/pair/request", "POST"), (P + "/capabilities", "GET"), ("/ui/signin", "POST")):
        _send(node.port, method, path, 1, chunked=False)
    before = _status(node.proc.pid)
    answers = {}
    for method, path in (("POST", P + "/pair/request"), ("GET", P + "/capabilities"),
                         ("POST", P + "/pair/confirm"), ("POST", "/ui/signin")):
        for chunked in (False, True):
            answers[f"{method} {path} {'chunked' if chunked else 'declared'}"] = \
                _send(node.port, method, path, BODY_MIB, chunked)
    after = _status(node.proc.pid)
    grown_mb = (after["VmHWM"] - before["VmHWM"]) / 1024
    _report("stranger-body-memory", {"bodyMiB": BODY_MIB, "sends": len(answers),
                                    "peakBeforeMB": round(before["VmHWM"] / 1024, 1),
                                    "peakAfterMB": round(after["VmHWM"] / 1024, 1),
                                    "peakGrowthMB": round(grown_mb, 1), "answers": answers})
    assert all(status == 413 for status in answers.values()), answers
    assert grown_mb <= GROWTH_BOUND_MB, (before, after)


def _refused_with_a_big_header(port: int, mb: int) -> int:
    """One /local/* request with no credential and an ``mb`` MB model header: its status."""
    head = (f"POST {P}/local/api/chat HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
            "X-Hub-Pool-Backend: ollama\r\nX-Hub-Pool-Model: ").encode()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(120)
        sock.sendall(head + b"m" * (mb * 1000 * 1000) + b"\r\n\r\n{}")
        raw = b""
        while b"\r\n" not in raw:
            chunk = sock.recv(4096)
            if not chunk:
                break
            raw += chunk
    return int(raw.split(b" ", 2)[1])


def test_forty_8_mb_model_headers_leave_nothing_held(node):
    with httpx.Client(base_url=node.url, timeout=30, trust_env=False, headers=node.headers()) as c:
        _refused_with_a_big_header(node.port, 1)  # warm: the refusal's code paths have run once
        before = _status(node.proc.pid)
        statuses = [_refused_with_a_big_header(node.port, 8) for _ in range(40)]
        after = _status(node.proc.pid)
        log = c.get(P + "/routing-log?limit=10000").json()
    longest = max(len(e["model"] or "") for e in log["entries"])
    held_mb = (after["VmRSS"] - before["VmRSS"]) / 1024
    _report("header-flood-memory", {"requests": len(statuses), "headerMB": 8,
                                    "rssBeforeMB": round(before["VmRSS"] / 1024, 1),
                                    "rssAfterMB": round(after["VmRSS"] / 1024, 1), "heldMB": round(held_mb, 1),
                                    "peakAfterMB": round(after["VmHWM"] / 1024, 1),
                                    "rowsHeld": len(log["entries"]), "longestModel": longest,
                                    "unauthenticatedRefusals": log["summary"].get("unauthenticatedRefusals")})
    assert statuses == [401] * 40
    assert longest <= 300
    assert held_mb <= GROWTH_BOUND_MB, (before, after)
