"""The failover decisions: whether an answer's status sends the walk on to the next candidate
(and what a peer's refusal says about the pairing), how a passed-over candidate is recorded,
and the 502 the app gets when every candidate failed (in an agent dialect's own error shape).
It is separate so the rules for which statuses fail over can be read and tested apart from the
walk that follows them.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import aiohttp
from starlette.types import Send

from hubpool_core.engine import AGENT_DIALECTS
from hubpool_core.placement import Candidate
from hubpool_core.proxy.attempt import Failed
from hubpool_core.proxy.plan import RelayPlan
from hubpool_core.proxy.translate import dialect_error

log = logging.getLogger("hubpool.relay")

#: local candidates fail over on these besides 5xx (the engine talking about its queue)
LOCAL_FAILOVER_4XX = frozenset({408, 429})
#: a peer also fails over on these: its own pairing checks, saying nothing about the request
PEER_FAILOVER_4XX = frozenset({401, 403, 404, 408, 429})
ENGINE_REFUSAL_WARN_INTERVAL_S = 600
_refusal_warned: dict[tuple[str, str, int], float] = {}


def fails_over(node: Any, plan: RelayPlan, cand: Candidate, upstream: aiohttp.ClientResponse, last: bool) -> bool:
    status = upstream.status
    if plan.inbound_from is not None:
        return False  # a forward is never re-routed here: the engine's answer goes back, marked
    if status >= 500 or status in LOCAL_FAILOVER_4XX:
        return True
    if cand.is_local or status not in PEER_FAILOVER_4XX:
        return False
    marked = "x-hub-pool-backend" in upstream.headers
    if marked and status in (401, 403):
        engine = upstream.headers.get("x-hub-pool-backend", cand.backend)
        key = (cand.node, engine, status)
        now = time.monotonic()
        if now - _refusal_warned.get(key, -1e9) >= ENGINE_REFUSAL_WARN_INTERVAL_S:
            _refusal_warned[key] = now
            log.warning("%s's %s answered %s: check the API key that peer holds for it", cand.node, engine, status)
        else:
            log.debug("%s's %s answered %s again", cand.node, engine, status)
        return not last  # from the last candidate it goes back as the engine's answer
    if status in (401, 403, 404) and not marked:
        # the peer's own pairing checks: it stopped trusting us; drop what it offered
        node.peers.try_update(cand.peer_id, last_capabilities=None)
        log.warning("%s refused this node (%s): its cached capabilities are dropped until it answers a "
                    "health poll", cand.node, status)
    return True


def passed_over(plan: RelayPlan, cand: Candidate, failure: Failed, last: bool = False) -> None:
    """Record a candidate the walk passed over for the next one: ``failedOverFrom``, its
    ``attempts`` entry and one "failover" log line. The ``last`` candidate was passed over
    for nothing: the walk ran out there, which is not a failover (the row's reason and the
    answer say how it ended), so only a line saying so is logged."""
    if last:
        log.warning("no candidate left for %s: %s (%s) failed: %s", plan.model, cand.node, cand.backend,
                    failure.reason)
        return
    row = plan.row
    row["failedOverFrom"].append(cand.node)
    row["attempts"].append({"node": cand.node, "backend": cand.backend, "status": failure.status,
                            "reason": failure.reason[:200]})
    # a peer busy past the wait this node allowed is placement at work, not a fault
    (log.info if failure.busy else log.warning)("failover: %s (%s) passed over for %s: %s", cand.node,
                                                cand.backend, plan.model, failure.reason)


async def exhausted(node: Any, plan: RelayPlan, send: Send, failures: list[Failed], started: float) -> None:
    row = plan.row
    total = len(plan.candidates)
    last = failures[-1].reason if failures else "no candidate answered"
    if failures and all(f.deadline for f in failures):
        message = (f'No pool candidate answered for model "{plan.model}" within its deadline ({total} '
                   f"candidate{'s' if total != 1 else ''} tried; {plan.budget_ms} ms each). This is a deadline, "
                   "not proof the nodes are down — a long prompt on a busy node can take longer; "
                   "HUB_POOL_FIRST_BYTE_TIMEOUT_MS and HUB_POOL_MIN_PREFILL_TOKENS_PER_SEC size it.")
    else:
        message = f'All {total} pool candidates for model "{plan.model}" failed: {last}'
    if plan.pin_note:
        message += " " + plan.pin_note
    node.routing_log.touch(row, outcome="failed", status=502, reason=last,
                           durationMs=int((time.monotonic() - started) * 1000))
    headers = [(b"content-type", b"application/json"), (b"x-hub-pool-request-id", row["id"].encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in plan.context_headers().items()]
    await send({"type": "http.response.start", "status": 502, "headers": headers})
    body = json.dumps({"error": message}).encode()  # the spec's shape on the OpenAI and Ollama routes
    if plan.dialect in AGENT_DIALECTS:  # an agent's SDK reads only its own dialect's error object
        body = dialect_error(plan.dialect, 502, body)
    await send({"type": "http.response.body", "body": body})
