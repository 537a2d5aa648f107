"""What one relayed request is: the plan the route handler builds, its time budgets, and the
few things every part of the relay reads the same way (the headers this node states on an
answer, the headers it passes through, the engine that knows a candidate's dialect). It is
separate so the route handlers and each part of the relay can depend on it without
depending on one another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from hubpool_core.engine import Engine
from hubpool_core.placement import Candidate

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "upgrade",
     "proxy-authenticate", "proxy-authorization", "te", "trailer", "date", "server"}
)
STREAM_TYPES = ("application/x-ndjson", "text/event-stream")
LOCAL_PREFIX = "/api/inference/pool/local"


@dataclass
class Budgets:
    connect_ms: int
    completion_ms: int
    min_prefill_tps: int

    def first_byte_ms(self, estimated_tokens: int) -> int:
        return max(self.connect_ms, math.ceil(estimated_tokens / self.min_prefill_tps) * 1000)

    def forward_ms(self, estimated_tokens: int, stream: bool) -> int:
        first = self.first_byte_ms(estimated_tokens)
        return first if stream else max(self.completion_ms, first)


@dataclass
class RelayPlan:
    route: str
    dialect: str
    body: dict[str, Any]
    raw: bytes
    model: str
    stream: bool
    candidates: list[Candidate]
    row: dict[str, Any]
    budget_ms: int
    extra_headers: dict[str, str] = field(default_factory=dict)
    #: the peer that forwarded this request (inbound /local/* rows), else None
    inbound_from: str | None = None
    pin_note: str | None = None
    #: options.num_ctx on the native routes (the window the request asks for), else None
    num_ctx: int | None = None
    #: the pool's own prompt estimate, bytes / 4 of the body as forwarded
    estimated_tokens: int = 0
    #: the placement context and the stages observing the walk (affinity remembers here)
    context: Any = None
    observers: list[Any] = field(default_factory=list)
    row_fault: str | None = None
    #: the request's trace span when the node traces (hubpool_core/telemetry/tracing.py), else None
    span: Any = None
    #: the admission queue already counted the first candidate in the load (its reservation)
    reserved: bool = False
    #: a stream that may be resumed on the next candidate (proxy/resume.py), else None
    resume: Any = None
    #: this attempt's request on its local engine's slot clock (placement/slot_clock.py), else None
    running: Any = None
    #: the wait this attempt's peer may take before it starts the request, named on the forward
    #: (proxy/start_within.py), else None
    start_within: int | None = None

    def context_headers(self) -> dict[str, str]:
        return dict(getattr(self.context, "response_headers", None) or {})


def request_error(plan: RelayPlan, signature: str, basis: str, confirms: str | None = None) -> dict[str, Any] | None:
    """A row's ``requestError``. Always None inbound (spec: routing log): the entry node judges
    the request and the output; a node serving a forward only records why it failed."""
    if plan.inbound_from is not None:
        return None
    return {"signature": signature, "basis": basis, "confirms": confirms}


def attribution(plan: RelayPlan, cand: Candidate, backend: str) -> list[tuple[bytes, bytes]]:
    if plan.inbound_from is not None:
        # a peer relaying from its engine marks the answer: that is how the sender tells an
        # engine's 401/403 from this node refusing the pairing
        return [(b"x-hub-pool-backend", backend.encode())]
    return [
        (b"x-hub-pool-served-by", cand.node.encode()),
        (b"x-hub-pool-backend", backend.encode()),
        (b"x-hub-pool-model", plan.model.encode("utf-8", "replace")),
        (b"x-hub-pool-request-id", plan.row["id"].encode()),
    ]


def pass_headers(upstream: aiohttp.ClientResponse) -> list[tuple[bytes, bytes]]:
    out = []
    for key, value in upstream.raw_headers:
        lk = key.lower()
        if lk.decode("latin-1") in HOP_BY_HOP or lk.startswith(b"x-hub-pool-"):
            continue  # attribution is always this node's own statement
        out.append((lk, value))
    return out


def engine_for(node: Any, cand: Candidate) -> Engine | None:
    """The engine object that knows this candidate's dialect details (by kind, for peers)."""
    if cand.local is not None:
        return cand.local.engine
    return node.engine_by_kind.get(cand.backend)
