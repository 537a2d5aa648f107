"""Where each stored Responses-API answer lives (spec gap filled by hubpool: the Responses
API keeps state on the engine that answered).

``previous_response_id`` and ``GET /v1/responses/{id}`` only work on the engine that stored
the response, so this node remembers, for every response it relayed from an engine that
serves Responses natively and kept it (``store`` not false), which node and engine that was.
A follow-up is placed there and nowhere else; when the id is unknown here, or its node
cannot take work now, the app is told so in the Responses error shape, never handed a
silent new conversation. In memory, bounded, least recently used dropped first.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from typing import Any

from hubpool_core.placement import Candidate

MAX_HOMES = 10_000
#: what a response id may be: engines mint resp_<hex>; nothing else reaches an engine's URL
RESPONSE_ID = re.compile(r"[A-Za-z0-9_.:-]{1,200}")
_ID = re.compile(rb'"id"\s*:\s*"([A-Za-z0-9_.:-]{1,200})"')
_NOT_STORED = re.compile(rb'"store"\s*:\s*false')


def response_id(first_bytes: bytes, whole: bool) -> str | None:
    """The id of a stored response in a body (``whole``) or a stream's first bytes; None
    when there is none or the engine did not store it."""
    if whole:
        try:
            body = json.loads(first_bytes)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return None
        if not isinstance(body, dict) or body.get("store") is False or not isinstance(body.get("id"), str):
            return None
        found = _ID.fullmatch(b'"id":"' + body["id"].encode() + b'"')
        return body["id"] if found else None
    if _NOT_STORED.search(first_bytes):
        return None
    match = _ID.search(first_bytes)  # response.created: the response's id is the first id
    return match.group(1).decode() if match else None


class ResponseHomes:
    def __init__(self, capacity: int = MAX_HOMES):
        self.capacity = capacity
        self._homes: OrderedDict[str, tuple[str, str]] = OrderedDict()

    def remember(self, rid: str, cand: Candidate) -> None:
        self._homes[rid] = (cand.node, cand.backend)
        self._homes.move_to_end(rid)
        while len(self._homes) > self.capacity:
            self._homes.popitem(last=False)

    def home(self, rid: str) -> tuple[str, str] | None:
        """(node, engine kind) that holds ``rid``, or None."""
        found = self._homes.get(rid)
        if found is not None:
            self._homes.move_to_end(rid)
        return found

    def restrict(self, plan: Any, body: dict[str, Any]) -> str | None:
        """Keep only the candidate holding ``previous_response_id``; the app's error
        message when there is none, None when the request may go on (or names no id)."""
        previous = body.get("previous_response_id")
        if not isinstance(previous, str):
            return None
        home = self.home(previous)
        if home is None:
            return (f'previous_response_id "{previous}" is not known to this node: a response is kept by the '
                    "engine that created it, and this node relayed none with that id (or restarted since). "
                    "Send the whole conversation as input instead.")
        held = [c for c in plan.candidates if (c.node, c.backend) == home]
        if not held:
            where = "this node" if home[0] == "local" else home[0]
            return (f'previous_response_id "{previous}" is held by {where}\'s {home[1]}, which cannot serve '
                    f"{plan.model} now (down, unpaired or not accepting work). Retry when it is back, or send "
                    "the whole conversation as input instead.")
        plan.candidates = held
        return None
