"""An engine's 500 that is a verdict on the request itself (no user message, a prompt over the
window, a chat template that cannot render it) rather than on the engine: reading the body
into a verdict, deciding whether it stands now (definitive, or confirmed by a second engine
with no other kind of candidate left that might answer otherwise) or the walk goes on, and
sending the engine's own answer back when it does. It is separate because the rules for
when one engine's refusal speaks for the pool are their own, and are tested on their own.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
from starlette.types import Send

from hubpool_core.engine import REQUEST_ERROR_SIGNATURES
from hubpool_core.models_ids import same_model
from hubpool_core.placement import Candidate
from hubpool_core.proxy.hangup import Hangup
from hubpool_core.proxy.judge import unservable
from hubpool_core.proxy.plan import RelayPlan, attribution, engine_for, pass_headers, request_error

DEFINITIVE = frozenset({"no-user-query", "missing-messages"})
VERDICT_BODY_LIMIT = 64 * 1024
VERDICT_READ_S = 5.0


@dataclass
class Verdict:
    """An engine's 500 that is a verdict on the request, held to be returned if it stands."""

    signature: str
    cand: Candidate
    status: int
    body: bytes
    headers: list[tuple[bytes, bytes]]
    window: int | None
    #: the earlier verdict this one agrees with (same signature; for a prompt too long, at
    #: the same window), set by :func:`carry`; None while it stands alone
    agrees_with: Verdict | None = None
    #: the engine kinds that gave this signature so far in the walk, this one's included
    refused_kinds: frozenset[str] = frozenset()


def window_of(node: Any, plan: RelayPlan, cand: Candidate) -> int | None:
    """The window this candidate would run the request at, or None when unknown here."""
    engine = engine_for(node, cand)
    if engine is not None and engine.renders_own_template:
        if plan.num_ctx:
            return plan.num_ctx
        if cand.is_local:
            return node.settings.current.maxNumCtx
        caps = cand.peer.last_capabilities if cand.peer is not None else None
        value = caps.get("maxNumCtx") if isinstance(caps, dict) else None
        return value if isinstance(value, int) and value > 0 else None
    if cand.local is not None:
        for m in cand.local.snapshot.result.models:
            if same_model(m.id, plan.model):
                return m.context_window
    return None  # a peer's cap says nothing about the window its other engines run


async def read_error_body(upstream: aiohttp.ClientResponse, hangup: Hangup) -> bytes | None:
    """The start of an error answer's body (at most 64 KB + 1 byte, within 5 s); None when
    nothing came. What is not read stays in the stream."""
    try:
        return await hangup.until(upstream.content.read(VERDICT_BODY_LIMIT + 1), VERDICT_READ_S)
    except (TimeoutError, aiohttp.ClientError):
        return None


def verdict_of(node: Any, plan: RelayPlan, cand: Candidate, upstream: aiohttp.ClientResponse,
               body: bytes) -> Verdict | None:
    """Ask the candidate's engine what a 500's body means: a verdict on the request, or None."""
    engine = engine_for(node, cand)
    if engine is None or len(body) > VERDICT_BODY_LIMIT:
        return None
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(parsed, dict):
        return None
    try:
        signature = engine.request_error(500, parsed)
    except Exception:  # noqa: BLE001 - a plugin bug means "no verdict"
        signature = None
    if signature not in REQUEST_ERROR_SIGNATURES:
        return None
    if signature == "chat-template" and cand.is_local:
        unservable(node, plan.model, cand, "chat-template")  # the node's own copy of the model can be what is broken
    return Verdict(signature, cand, upstream.status, body, pass_headers(upstream), window_of(node, plan, cand),
                   refused_kinds=frozenset({cand.backend}))


async def read_verdict(node: Any, plan: RelayPlan, cand: Candidate, upstream: aiohttp.ClientResponse,
                       hangup: Hangup) -> Verdict | None:
    """Read a 500's body (at most 64 KB, within 5 s) and ask the engine what it means."""
    if engine_for(node, cand) is None:
        return None
    body = await read_error_body(upstream, hangup)
    return None if body is None else verdict_of(node, plan, cand, upstream, body)


async def served_forward_failed(node: Any, plan: RelayPlan, cand: Candidate, upstream: aiohttp.ClientResponse,
                                hangup: Hangup) -> bytes | None:
    """A node serving a peer's forward relays its engine's 5xx as it came, and corrects its
    own capabilities as an entry node does (spec: "When a node lists a model it cannot
    actually serve"): the 5xx strikes the model on that engine, unless it is the engine's
    verdict on the request. Returns the part of the body read to tell (None: nothing read)."""
    body = None
    if upstream.status == 500:
        body = await read_error_body(upstream, hangup)
        if body is not None and verdict_of(node, plan, cand, upstream, body) is not None:
            return body  # the request's fault, not the model's (a template already struck it)
    unservable(node, plan.model, cand, f"HTTP {upstream.status}")
    if cand.local is not None:
        node.local.invalidate(cand.local.engine)  # the next placement reads the withhold at once
    return body


def _agrees(pending: Verdict, verdict: Verdict) -> bool:
    if pending.signature != verdict.signature:
        return False
    # a prompt too long is confirmed only by a second engine at the same, known window
    return verdict.signature != "context-length" or (verdict.window is not None and verdict.window == pending.window)


def carry(pending: Verdict | None, verdict: Verdict) -> Verdict:
    """The verdict the walk holds after ``verdict``: it, agreeing with ``pending`` when it
    does. A new signature (or a prompt too long at another window) replaces the pending one."""
    if pending is None or not _agrees(pending, verdict):
        return verdict
    return replace(verdict, agrees_with=pending, refused_kinds=pending.refused_kinds | verdict.refused_kinds)


def settle_verdict(node: Any, plan: RelayPlan, verdict: Verdict,
                   attempt: int) -> tuple[Verdict, str, str | None] | None:
    """(verdict, basis, confirms) when it stands now; None when the walk goes on.
    ``verdict`` has been through :func:`carry` with the pending one."""
    if verdict.signature in DEFINITIVE:
        return verdict, "definitive", None
    if verdict.agrees_with is None:
        return None
    ahead = plan.candidates[attempt:]
    if verdict.signature == "context-length":
        window = verdict.window or 0  # known: agreeing on a window needs one
        if any((w := window_of(node, plan, c)) is None or w > window for c in ahead):
            return None  # a larger window, or one this node cannot see, might serve it
    elif any(c.backend not in verdict.refused_kinds for c in ahead):
        # spec: the walk goes on while a candidate ahead runs an engine (a kind: vLLM, llama.cpp,
        # Lemonade, oMLX and Ollama each render templates and parse messages their own way)
        # that has not refused
        return None
    return verdict, "confirmed", verdict.agrees_with.cand.node


def settle_at_end(verdict: Verdict) -> tuple[str, str | None]:
    """(basis, confirms) for the last candidate's verdict, returned with no candidate left:
    confirmed only when it agreed with the one before, else last-candidate."""
    if verdict.agrees_with is not None:
        return "confirmed", verdict.agrees_with.cand.node
    return "last-candidate", None


async def send_verdict(node: Any, plan: RelayPlan, send: Send, verdict: Verdict, basis: str,
                       confirms: str | None, started: float) -> None:
    """The engine's own body and headers; 400 (a template keeps its 500)."""
    row = plan.row
    status = 500 if verdict.signature == "chat-template" else 400
    headers = [(k, v) for k, v in verdict.headers if k not in (b"content-type",)]
    headers.append((b"content-type", b"application/json"))
    headers += attribution(plan, verdict.cand, verdict.cand.backend)
    if status != verdict.status:
        headers.append((b"x-hub-pool-upstream-status", str(verdict.status).encode()))
    headers += [(k.lower().encode(), v.encode()) for k, v in plan.context_headers().items()]
    node.routing_log.touch(
        row, outcome="failed", status=verdict.status, node=plan.inbound_from or verdict.cand.node,
        peerId=verdict.cand.peer_id, backend=verdict.cand.backend,
        durationMs=int((time.monotonic() - started) * 1000), reason=f"HTTP 500 ({verdict.signature})",
        requestError=request_error(plan, verdict.signature, basis, confirms))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": verdict.body})
