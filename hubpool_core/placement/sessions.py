"""Which session a request belongs to, from the ids agents already send (spec: Prefix
affinity, "The key"; hubpool adds the sources beyond X-Hub-Pool-Session).

``poolSessionSources`` lists where to look, first match wins: ``header:<name>`` reads a
request header, ``body:<dotted.path>`` a string in the JSON body. The defaults are
hubpool's own header, Anthropic's ``metadata.user_id`` (Claude Code puts its session id
there) and the ``session_id`` header Codex sends. X-Hub-Pool-Session keeps its character
rules and travels to the serving peer as before; every other value is hashed here, before
anything keeps it, and is never logged.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

HUB_HEADER = "x-hub-pool-session"
#: X-Hub-Pool-Session's own rule: 1-128 of these, starting alphanumeric
HUB_SESSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,127}")
MAX_VALUE_CHARS = 1024


def _body_value(body: Mapping[str, Any], path: str) -> Any:
    value: Any = body
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def session_of(sources: Sequence[str], headers: Mapping[str, str],
               body: Mapping[str, Any]) -> tuple[str, str] | None:
    """(value, source name) of the first configured source the request carries, or None.

    ``sources`` is poolSessionSources (default :data:`DEFAULT_SESSION_SOURCES`);
    ``headers`` are lower-case (as ASGI gives them). The value of X-Hub-Pool-Session is
    returned as sent (when it passes its rules); any other is a hex SHA-256 of the source
    and the value."""
    for source in sources:
        kind, _, name = source.partition(":")
        if kind == "header":
            value = headers.get(name.lower())
            if name.lower() == HUB_HEADER:
                if isinstance(value, str) and HUB_SESSION.fullmatch(value):
                    return value, "X-Hub-Pool-Session"
                continue
        elif kind == "body":
            value = _body_value(body, name)
        else:
            continue
        if isinstance(value, str) and 0 < len(value) <= MAX_VALUE_CHARS and value.strip():
            return hashlib.sha256(f"{source}\0{value}".encode("utf-8", "replace")).hexdigest(), name
    return None
