"""One upstream attempt: open the request for one candidate (a local engine, translated when
it does not speak the request's dialect, or a peer with a signed forward), send it, and wait
for the answer's headers within the plan's budget, retrying once on a fresh connection when
a kept-alive one was closed under it. Also what an attempt's failure is and how a transport
error is named in it. It is separate so the walk only decides what to do with the outcome.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

import aiohttp

from hubpool_core.peering.client import PeerAuthError
from hubpool_core.placement import Candidate
from hubpool_core.proxy.connector import SEND_STATE, SendState, reset_before_answer
from hubpool_core.proxy.hangup import Hangup
from hubpool_core.proxy.plan import LOCAL_PREFIX, RelayPlan
from hubpool_core.proxy.start_within import HEADER as START_WITHIN
from hubpool_core.proxy.translate import Translator, judged_dialect, translator_for

if TYPE_CHECKING:
    from hubpool_core.proxy.verdicts import Verdict

log = logging.getLogger("hubpool.relay")


class Failed(Exception):
    """One candidate did not give an answer the walk keeps: it is passed over."""

    def __init__(self, status: int | None, reason: str, deadline: bool = False, verdict: Verdict | None = None,
                 busy: bool = False):
        super().__init__(reason)
        self.status, self.reason, self.deadline, self.verdict = status, reason, deadline, verdict
        #: a peer turned the request back before starting it (proxy/start_within.py): no fault
        self.busy = busy


def transport_code(exc: BaseException) -> str:
    cause: BaseException | None = exc
    while cause is not None:
        errno = getattr(cause, "errno", None)
        if errno == 111:
            return "ECONNREFUSED"
        if errno == 104:
            return "ECONNRESET"
        cause = cause.__cause__ or getattr(cause, "os_error", None)
        if cause is exc:
            break
    return type(exc).__name__


async def open_request(node: Any, plan: RelayPlan, cand: Candidate,
                       attempt_span: Any) -> tuple[Any, Translator | None]:
    """The upstream request for one candidate (not yet awaited) and its translator."""
    translator: Translator | None
    if cand.local is not None:
        engine = cand.local.engine
        route, body_bytes = plan.route, plan.raw
        # native first, byte for byte: the engine's probed dialects say whether it needs one
        translator = translator_for(plan.route, plan.dialect, plan.body, plan.stream, cand.local.dialects)
        if translator is not None:
            route, body_bytes = translator.upstream_route, json.dumps(translator.upstream_body).encode()
        dialect = judged_dialect(plan.dialect, translator)
        url = engine.base_url + engine.upstream_path(dialect, route)
        headers = {"Content-Type": "application/json", **engine.auth_headers()}
    else:
        path = LOCAL_PREFIX + plan.route
        try:
            auth = await node.peer_client.auth_headers(cand.peer, "POST", path, None)
        except PeerAuthError as exc:
            raise Failed(None, str(exc)) from None
        url = node.peer_client.base_url(cand.node) + path
        headers = {"Content-Type": "application/json", **auth, "X-Hub-Pool-Backend": cand.backend,
                   "X-Hub-Pool-Model": plan.model, "X-Hub-Pool-Request-Id": plan.row["id"]}
        if plan.start_within is not None:  # start within this or turn it back (proxy/start_within.py)
            headers[START_WITHIN] = str(plan.start_within)
        if plan.span is not None:  # the peer's span continues this attempt's trace (not signed)
            node.tracer.inject(attempt_span, headers)
        translator, body_bytes = None, plan.raw
    headers.update(plan.extra_headers)
    request = node.session.post(url, data=body_bytes, headers=headers,
                                skip_auto_headers=("Accept-Encoding",))
    return request, translator


async def send_attempt(node: Any, plan: RelayPlan, cand: Candidate, hangup: Hangup, attempt_started: float,
                       attempt_span: Any) -> tuple[aiohttp.ClientResponse, Translator | None]:
    """Send one attempt and wait for the answer's headers, within the plan's budget.

    When the request went out on a reused keep-alive connection and the other side closed
    or reset it before any byte of an answer, it is sent once more on a fresh connection:
    the engine (or peer) closed the idle connection just as it was reused, and never saw
    the request (RFC 9112 §9.3.1; browsers and Envoy retry this case). Anything else, and
    any second failure, is the attempt's failure as before."""
    budget_s = plan.budget_ms / 1000
    request, translator = await open_request(node, plan, cand, attempt_span)
    state = SendState()
    token = SEND_STATE.set(state)
    try:
        return await hangup.until(request, budget_s), translator
    except aiohttp.ClientError as exc:
        if not (state.reused and reset_before_answer(exc)):
            raise
        first = exc
        log.info("%s closed a kept-alive connection as it was reused (%s): sending again on a fresh one",
                 cand.node, transport_code(exc))
    finally:
        SEND_STATE.reset(token)
    remaining = budget_s - (time.monotonic() - attempt_started)
    if remaining <= 0:
        raise TimeoutError()
    # open_request again: a peer's signature carries a nonce, which is never sent twice
    request, translator = await open_request(node, plan, cand, attempt_span)
    token = SEND_STATE.set(SendState(fresh=True))
    try:
        return await hangup.until(request, remaining), translator
    except aiohttp.ClientError:
        # the retry failed too (a node that died mid-request refuses the fresh connection):
        # the attempt's reason is what happened to the request itself, not to its retry
        raise first from None
    finally:
        SEND_STATE.reset(token)
