"""The fuzz targets: each takes raw bytes, and raises only when it finds a defect.

A target never returns an error for bad input: the code under test must turn any input into a
refusal or a verdict, never an exception, and the invariants checked here must hold. Targets
are plain functions so the corpus replay in CI needs no atheris.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable

from starlette.requests import Request

from hubpool_core.access import sessions
from hubpool_core.access.guards import source_ip
from hubpool_core.api import local as local_routes
from hubpool_core.api import peers as peer_routes
from hubpool_core.api.edge import BodyTooLarge, read_capped
from hubpool_core.engine import NATIVE, OPENAI, Engine
from hubpool_core.peering.addresses import AddressRefused, parse_address, resolve_checked
from hubpool_core.peering.guard import PeerRefused, single_valued
from hubpool_core.peering.pairing import PairingError
from hubpool_core.peering.signing import (
    NODE_HEADER,
    NONCE_HEADER,
    PEER_HEADER,
    RECIPIENT_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    NonceCache,
    normalize_peer_fqdn,
    sign_headers,
    signing_key_from_pkcs8,
    spki_from_verify_key,
    verify_headers,
)
from hubpool_core.proxy.output_check import StreamJudge, degenerate, judge_whole
from hubpool_core.proxy.translate import NativeToOpenAI
from hubpool_core.telemetry.routing_log import MAX_TEXT, REFUSAL_CAPACITY, RoutingLog
from hubpool_core.web import routes as web_routes


def _is_final(dialect: str, frame: bytes) -> bool:
    return Engine.is_final_frame(None, dialect, frame)  # type: ignore[arg-type]


def _cuts(data: bytes, seed: bytes) -> list[bytes]:
    """``data`` cut at points chosen by ``seed``: every split must parse the same."""
    points = sorted({b % (len(data) + 1) for b in seed})
    out, last = [], 0
    for p in points:
        out.append(data[last:p])
        last = p
    out.append(data[last:])
    return out


_VOLATILE = re.compile(rb'"(created_at|total_duration)": ("[^"]*"|[0-9]+)')


def frames(data: bytes) -> None:
    """SSE/NDJSON frame parsing: the output judge and the SSE->NDJSON translator, fed whole,
    in slices chosen by the input and one byte at a time, must agree and never raise."""
    if len(data) < 3:
        return
    dialect = OPENAI if data[0] & 1 else NATIVE
    seed, stream = data[1:3], data[3:]
    verdicts = []
    for pieces in ([stream], _cuts(stream, seed), [stream[i:i + 1] for i in range(len(stream))][:4096]):
        if sum(map(len, pieces)) != len(stream):
            continue  # the one-byte split is capped
        judge = StreamJudge(dialect, _is_final)
        for piece in pieces:
            judge.feed(piece)
        verdicts.append((judge.verdict(dropped=bool(data[0] & 2)), judge.final_seen, judge.recognised))
    assert all(v == verdicts[0] for v in verdicts), verdicts

    outputs = []
    for pieces in ([stream], _cuts(stream, seed)):
        translator = NativeToOpenAI("/api/chat" if data[0] & 4 else "/api/generate",
                                    {"model": "m", "messages": [], "prompt": "p"}, True)
        lines = b"".join(b"".join(translator.feed(p)) for p in pieces) + b"".join(translator.end())
        for line in lines.splitlines():
            json.loads(line)  # every line the translator emits is JSON
        outputs.append(_VOLATILE.sub(b"", lines))
    assert outputs[0] == outputs[1]


def output_check(data: bytes) -> None:
    """The non-streamed judge: any body gives None or a verdict name, never an exception."""
    for dialect in (NATIVE, OPENAI):
        assert judge_whole(dialect, data) in (None, "truncated-upstream", "degenerate-output")
    text = data.decode("utf-8", "replace")
    assert degenerate(text) in (True, False)


_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


def fqdn(data: bytes) -> None:
    """normalize_peer_fqdn: None, or a canonical name that is a fixed point and keeps every
    rule of protocol.md §8.18."""
    text = data.decode("utf-8", "replace")
    out = normalize_peer_fqdn(text)
    if out is None:
        return
    assert normalize_peer_fqdn(out) == out
    assert out.isascii() and len(out) <= 253 and out == out.lower()
    labels = out.split(".")
    assert len(labels) >= 2 and all(_LABEL.fullmatch(label) for label in labels)
    assert not labels[-1].isdigit()


async def _never(host: str) -> list[str]:
    raise AssertionError(f"an IP literal reached the resolver: {host!r}")


async def _lan(host: str) -> list[str]:
    return ["192.168.5.5"]


def address(data: bytes) -> None:
    """parse_address: a ValueError with a sentence, or a target whose display parses back to
    itself; an IP literal is judged without the resolver, a name with it."""
    text = data.decode("utf-8", "replace")
    try:
        target = parse_address(text)
    except AddressRefused:
        raise AssertionError("parse_address must refuse with ValueError, not AddressRefused") from None
    except ValueError as exc:
        assert str(exc)
        return
    assert parse_address(target.display) == target
    assert all(ch not in target.host for ch in "/\\@?#% \t\r\n\x00[]")
    resolver = _never if target.ip_literal is not None else _lan
    try:
        ips = asyncio.run(resolve_checked(target, resolver=resolver))
    except AddressRefused as exc:
        assert str(exc)
        return
    assert ips and all(isinstance(ip, str) for ip in ips)


_KEY = signing_key_from_pkcs8("MC4CAQAwBQYDK2VwBCIEIJ+DYvh6SEqVTm50DFtMDoQikTmiCqirVv9mWG9qfSnF")
_SPKI = spki_from_verify_key(_KEY.verify_key)
_SENDER = "0b8e8f57-3f4a-4c1e-9a53-2f6f0c1d7e11"
_RECIPIENT = "5c0ffee0-1234-4abc-8def-0123456789ab"
_TS = 1_800_000_000_000
_PATH = "/api/inference/pool/capabilities"
_GENUINE = sign_headers(_KEY, "GET", _PATH, _SENDER, "hub-a.example-tailnet.ts.net", _RECIPIENT, None,
                        now_ms=_TS, nonce="AAAAAAAAAAAAAAAAAAAAAA")
_NAMES = [NODE_HEADER, PEER_HEADER, TIMESTAMP_HEADER, NONCE_HEADER, SIGNATURE_HEADER, RECIPIENT_HEADER]


def signature_headers(data: bytes) -> None:
    """The signature-header parser: the input replaces some of a genuine request's headers
    (first byte: which ones) and may repeat them; anything but the genuine request is refused,
    and nothing raises."""
    if not data:
        return
    mask, values = data[0], data[1:].decode("utf-8", "replace").split("\n")
    headers = dict(_GENUINE)
    pairs: list[tuple[str, str]] = []
    for i, name in enumerate(_NAMES):
        if mask & (1 << i) and values:
            headers[name] = values.pop(0)
    pairs = list(headers.items())
    if mask & 0x80 and values:
        pairs.append((_NAMES[len(values) % len(_NAMES)], values.pop(0)))
    try:
        flat = single_valued(pairs)
    except PeerRefused:
        assert len({k.lower() for k, _ in pairs}) < len(pairs)
        return
    verdict = verify_headers(flat, "GET", _PATH, None, sender_public_key_b64=_SPKI, recipient_uuid=_RECIPIENT,
                             nonces=NonceCache(), now_ms=_TS)
    if verdict.ok:
        # only a spelling of the genuine values can pass: same signed lines, same signature
        assert flat[NODE_HEADER.lower()] == _SENDER
        assert flat[NONCE_HEADER.lower()] == _GENUINE[NONCE_HEADER]
        assert flat[SIGNATURE_HEADER.lower()] == _GENUINE[SIGNATURE_HEADER]
    else:
        assert verdict.reason in {"missing_headers", "bad_peer_fqdn", "bad_signature_encoding", "bad_timestamp",
                                  "expired", "before_start", "replayed", "nonce_cache_full", "bad_signature"}


def _request(headers: list[tuple[bytes, bytes]], pieces: list[bytes], pulled: list[int]) -> Request:
    """A Starlette request whose body arrives as ``pieces``, one ASGI message each; ``pulled``
    records the size of every message the code under test asked for."""
    queue = list(pieces)

    async def receive() -> dict:
        if not queue:
            return {"type": "http.disconnect"}
        chunk = queue.pop(0)
        pulled.append(len(chunk))
        return {"type": "http.request", "body": chunk, "more_body": bool(queue)}

    scope = {"type": "http", "method": "POST", "path": "/", "raw_path": b"/", "query_string": b"",
             "headers": headers, "client": ("192.0.2.1", 1), "server": ("127.0.0.1", 5002)}
    return Request(scope, receive)


_DECLARED = re.compile(rb"[0-9]{1,20}")


def edge_body(data: bytes) -> None:
    """A stranger's body at the door (api/edge.py, and the pairing routes' and the sign-in
    form's readers over it). The first byte picks the reader (and for the bare reader a limit
    of 1 to 4081 bytes), the first line is the declared Content-Length (or none), the next
    bytes cut the body into ASGI messages. A declared length over the limit is refused before
    anything is read; a longer body is refused by the message that passes the limit, nothing
    after it is asked for; anything else comes back exactly as sent, and the routes' parsers
    answer with a refusal or a value, never an exception."""
    if len(data) < 2:
        return
    mode, limit = data[0] % 3, 1 + (data[0] >> 2) * 64
    declared, _, rest = data[1:].partition(b"\n")
    seed, body = rest[:3], rest[3:]
    pieces = _cuts(body, seed)
    headers = [] if data[0] & 2 and declared == b"" else [(b"content-length", declared)]
    pulled: list[int] = []
    request = _request(headers, pieces, pulled)
    if mode == 1:
        limit = peer_routes.MAX_CONTROL_BODY
    elif mode == 2:
        limit = web_routes.MAX_FORM_BYTES
    stated = declared.strip(b" \t")
    over_declared = bool(headers) and _DECLARED.fullmatch(stated) is not None and int(stated) > limit
    refused = over_declared or len(body) > limit
    if mode == 2:
        form = asyncio.run(web_routes._form(request))  # noqa: SLF001 - the sign-in form's own reader
        assert (form is None) == refused
        assert form is None or all(isinstance(k, str) and isinstance(v, str) for k, v in form.items())
    try:
        if mode == 0:
            got = asyncio.run(read_capped(request, limit))
            assert got == body, "read_capped must return exactly the bytes sent"
        elif mode == 1:
            asyncio.run(peer_routes._body(request))  # noqa: SLF001 - the pairing routes' own reader
    except BodyTooLarge as exc:
        assert mode == 0 and exc.message
    except PairingError as exc:
        assert mode == 1 and exc.status in (400, 413) and exc.message
        assert (exc.status == 413) == refused
    else:
        assert mode == 2 or not refused
    if over_declared:
        assert pulled == [], "a declared length over the limit is refused before the body is read"
    else:
        assert sum(pulled[:-1]) <= limit, "nothing is asked for after the bytes passed the limit"


def strings_in(value: object) -> list[str]:
    """Every string inside ``value`` (dict keys and values, list and tuple items, nested)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in strings_in(k) + strings_in(v)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in strings_in(v)]
    return []


def refusal_headers(data: bytes) -> None:
    """What a refused /local/* caller's headers leave in the routing log (api/local.py's
    refusal_row over a real RoutingLog holding one decision). The input is the headers, one
    per line (``name: value``, latin-1 as a server passes them), repeated by its first byte;
    every second request comes from an admitted peer. Every string the log keeps is at most
    MAX_TEXT; an unadmitted caller's row never takes the decision's id or place, and the kept
    refusals never outnumber REFUSAL_CAPACITY."""
    if not data:
        return
    log = RoutingLog()
    decision = log.open(direction="outbound", path="/api/chat", model="m:1b", request_id="decision-1")
    log.touch(decision, node="local", outcome="served", status=200, durationMs=5, totalMs=9)
    kept = dict(decision)
    headers: dict[str, str] = {}
    for line in data[1:].decode("latin-1").split("\n"):
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    headers.setdefault("x-hub-pool-request-id", "decision-1")
    repeats = 1 + data[0] % 60
    for i in range(repeats):
        sender = "hub-b.example-tailnet.ts.net" if data[0] & 0x80 and i % 2 else None
        local_routes.refusal_row(log, "/api/chat", sender, headers, 401, "Invalid pool peer credentials")
    rows = log.entries()
    assert all(len(s) <= MAX_TEXT for s in strings_in(rows))
    assert len(log.refusals) <= REFUSAL_CAPACITY
    assert log.unauthenticated_refusals == sum(1 for i in range(repeats) if not (data[0] & 0x80 and i % 2))
    if not data[0] & 0x80:
        assert log.rows["decision-1"] == kept and len(log.rows) == 1  # only admitted callers reach the ring


_PROXY_HEADERS = ("x-forwarded-for", "cf-ray", "cf-connecting-ip", "true-client-ip", "x-real-ip")


def signin_sources(data: bytes) -> None:
    """The web sign-in limiter over the sources a stranger's headers name (access/guards.py's
    source_ip, access/sessions.py's SignInLimiter), with the clock standing still. The first
    byte says whether the proxy is trusted; then each pair of bytes is one wrong key: a client
    address, and which proxy headers it sends (an X-Forwarded-For built from the bytes). The
    source is the client address, the last forwarded hop when the proxy is trusted, or None;
    the limiter never tracks more than MAX_SOURCES sources; a source held back stays held back
    whatever else comes; a source that never guessed is let in while one tracked source is not
    held back."""
    if not data:
        return
    trust = bool(data[0] & 1)
    limiter = sessions.SignInLimiter()
    counts: dict[str | None, int] = {}
    pairs = [data[i:i + 2] for i in range(1, len(data) - 1, 2)]
    for a, b in pairs:
        client = f"10.{a >> 4}.{a & 15}.{b}"
        headers = {name: f"203.0.{a}.{b}, 198.51.100.{b}" if name == "x-forwarded-for" else f"v{b}"
                   for i, name in enumerate(_PROXY_HEADERS) if b & (1 << i)}
        source = source_ip(client, headers, trust)
        forwarded = "x-forwarded-for" in headers
        if trust and forwarded:
            assert source == f"198.51.100.{b}"
        elif not trust and (forwarded or any(h in headers for h in _PROXY_HEADERS[1:4])):
            assert source is None
        else:
            assert source == client
        limiter.failed(source)
        counts[source] = counts.get(source, 0) + 1
        assert len(limiter) <= sessions.MAX_SOURCES
    for source, n in counts.items():
        if n >= sessions.MAX_FAILURES and len(counts) <= sessions.MAX_SOURCES:
            assert not limiter.allowed(source), source
    assert limiter.allowed("192.0.2.1") or len(counts) >= sessions.MAX_SOURCES


TARGETS: dict[str, Callable[[bytes], None]] = {
    "frames": frames,
    "output_check": output_check,
    "fqdn": fqdn,
    "address": address,
    "signature_headers": signature_headers,
    "edge_body": edge_body,
    "refusal_headers": refusal_headers,
    "signin_sources": signin_sources,
}
