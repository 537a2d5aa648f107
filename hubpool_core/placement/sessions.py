"""Which session a request belongs to, from the ids agents already send (spec: Prefix
affinity, "The key"; hubpool adds the sources beyond X-Hub-Pool-Session).

``poolSessionSources`` lists where to look, first match wins: ``header:<name>`` reads a
request header (names compared case-insensitively, ``-`` and ``_`` alike: Codex spells its
header ``session-id`` in one release and ``session_id`` in another), ``body:<dotted.path>``
a string in the JSON body. The defaults cover every agent hubpool is tested with:

- hubpool's own ``X-Hub-Pool-Session``;
- Claude Code's ``X-Claude-Code-Session-Id`` header and its ``metadata.user_id``, which is a
  JSON string ``{"device_id", "account_uuid", "session_id"}`` (older builds:
  ``user_<hash>_account_<uuid>_session_<uuid>``), read for its session id alone;
- Codex's ``session-id`` header and its body's ``prompt_cache_key``;
- OpenCode's ``x-session-id`` and ``x-session-affinity`` headers.

X-Hub-Pool-Session keeps its character rules and travels to the serving peer as before;
every other value is hashed here, before anything keeps it, and is never logged.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

HUB_HEADER = "x-hub-pool-session"
#: X-Hub-Pool-Session's own rule: 1-128 of these, starting alphanumeric
HUB_SESSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,127}")
MAX_VALUE_CHARS = 1024
#: Claude Code before its JSON metadata: user_<hash>_account_<uuid>_session_<uuid>
_LEGACY_USER_ID = re.compile(r"user_[^_]*_account_[^_]*_session_([A-Za-z0-9-]+)")

def _header_key(name: str) -> str:
    return name.lower().replace("_", "-")


def _body_value(body: Mapping[str, Any], path: str) -> Any:
    value: Any = body
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def session_part(value: str) -> str:
    """The session id inside a value that carries more than one: a JSON object's
    ``session_id`` (Claude Code's ``metadata.user_id``), or the tail of the legacy
    ``user_…_account_…_session_<id>`` form; any other value is the session id itself."""
    if value.startswith("{"):
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):
            return value
        inner = parsed.get("session_id") if isinstance(parsed, dict) else None
        return inner if isinstance(inner, str) and inner.strip() else value
    legacy = _LEGACY_USER_ID.fullmatch(value)
    return legacy.group(1) if legacy else value


def session_of(sources: Sequence[str], headers: Mapping[str, str],
               body: Mapping[str, Any]) -> tuple[str, str] | None:
    """(value, source name) of the first configured source the request carries, or None.

    ``sources`` is poolSessionSources (default ``config.DEFAULT_SESSION_SOURCES``);
    ``headers`` any mapping of the request's headers (looked up case-insensitively, ``-``
    and ``_`` alike). The value of X-Hub-Pool-Session is returned as sent (when it passes
    its rules); any other is a hex SHA-256 of the source and the session id in the value.
    The source name is the configured one without its kind (``X-Claude-Code-Session-Id``,
    ``metadata.user_id``), what the routing log's ``affinity.keySource`` shows."""
    folded: dict[str, str] | None = None
    for source in sources:
        kind, _, name = source.partition(":")
        if kind == "header":
            if folded is None:
                folded = {_header_key(k): v for k, v in headers.items()}
            value: Any = folded.get(_header_key(name))
            if _header_key(name) == HUB_HEADER:
                if isinstance(value, str) and HUB_SESSION.fullmatch(value):
                    return value, "X-Hub-Pool-Session"
                continue
        elif kind == "body":
            value = _body_value(body, name)
        else:
            continue
        if isinstance(value, str) and 0 < len(value) <= MAX_VALUE_CHARS and value.strip():
            session = session_part(value)
            return hashlib.sha256(f"{source}\0{session}".encode("utf-8", "replace")).hexdigest(), name
    return None
