"""Cookie sessions for the web UI.

Signing in with the operator key mints an opaque random session id (the cookie, HttpOnly,
SameSite=Strict) and a separate CSRF token the pages carry in a <meta> tag. The operator
guard accepts the cookie in place of a Bearer key; on a write it also demands the CSRF token
in ``X-CSRF-Token`` (or the form field ``csrf``), because a cookie alone says only that a
browser holds it, not that this node's own page sent the request.

Sessions live in memory per KeyStore, so several nodes in one process (the tests) never share
them, and a restart signs everyone out, which is what an operator expects of a restart.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
import weakref
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any

from hubpool_core.access.credentials import KeyStore, Principal

#: twelve hours: long enough for a working day at the dashboard, short enough that a
#: forgotten browser does not stay signed in for good
SESSION_SECONDS = 12 * 3600
MAX_SESSIONS = 64  # a node has few operators; the oldest goes first beyond this
#: wrong keys allowed per minute before sign-in answers 429 for the rest of that minute
MAX_FAILURES = 10
FAILURE_WINDOW_SECONDS = 60
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf"


@dataclass
class Session:
    """One signed-in browser."""

    sid: str
    csrf: str
    expires: float
    created: float = field(default_factory=time.time)


class SessionStore:
    """The signed-in browsers of one node."""

    def __init__(self, keys: KeyStore):
        self._sessions: dict[str, Session] = {}
        self._failures: list[float] = []
        # every node on one host shares the browser's cookie jar (cookies ignore the port),
        # so the cookie carries a name of its own per node
        digest = hashlib.sha256(b"hubpool-session:" + keys.operator_key.encode()).hexdigest()[:10]
        self.cookie_name = f"hubpool_session_{digest}"

    def create(self) -> Session:
        """Mint a session for a browser that just presented the operator key."""
        self._expire()
        while len(self._sessions) >= MAX_SESSIONS:
            oldest = min(self._sessions.values(), key=lambda s: s.created)
            self._sessions.pop(oldest.sid, None)
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), time.time() + SESSION_SECONDS)
        self._sessions[session.sid] = session
        return session

    def get(self, sid: str | None) -> Session | None:
        """The live session with this id, or None."""
        if not sid:
            return None
        session = self._sessions.get(sid)
        if session is None:
            return None
        if session.expires <= time.time():
            self._sessions.pop(sid, None)
            return None
        return session

    def destroy(self, sid: str | None) -> None:
        """Sign one browser out; unknown ids are ignored."""
        if sid:
            self._sessions.pop(sid, None)

    def sign_in_allowed(self) -> bool:
        """False after too many wrong keys in the last minute (an env operator key may be short)."""
        now = time.time()
        self._failures = [t for t in self._failures if now - t < FAILURE_WINDOW_SECONDS]
        return len(self._failures) < MAX_FAILURES

    def failed_sign_in(self) -> None:
        """Count one wrong key toward the limit."""
        self._failures.append(time.time())

    def from_headers(self, headers: dict[str, str]) -> Session | None:
        """The session named by the request's cookie header, if any."""
        return self.get(read_cookie(headers.get("cookie", ""), self.cookie_name))

    def _expire(self) -> None:
        now = time.time()
        for sid in [s.sid for s in self._sessions.values() if s.expires <= now]:
            self._sessions.pop(sid, None)


_STORES: weakref.WeakKeyDictionary[KeyStore, SessionStore] = weakref.WeakKeyDictionary()


def store_for(keys: KeyStore) -> SessionStore:
    """The session store of the node that owns ``keys``."""
    store = _STORES.get(keys)
    if store is None:
        store = _STORES[keys] = SessionStore(keys)
    return store


def read_cookie(header: str, name: str) -> str | None:
    """One cookie's value from a Cookie header; a malformed header reads as no cookie."""
    if not header:
        return None
    jar = SimpleCookie()
    try:
        jar.load(header)
    except Exception:  # noqa: BLE001 - a garbled cookie header is simply not a session
        return None
    morsel = jar.get(name)
    return morsel.value if morsel else None


def csrf_ok(session: Session, presented: str | None) -> bool:
    """Whether the CSRF token sent with a write is this session's."""
    if not presented:
        return False
    return hmac.compare_digest(presented.encode(), session.csrf.encode())


def session_refusal(method: str, headers: dict[str, str], keys: KeyStore) -> Principal | tuple[int, dict] | None:
    """The operator guard's cookie branch.

    None when the request carries no live session (the guard then refuses as before), the
    operator principal when it does, or a refusal when a write lacks the session's CSRF token.
    """
    session = store_for(keys).from_headers(headers)
    if session is None:
        return None
    if method not in ("GET", "HEAD") and not csrf_ok(session, headers.get(CSRF_HEADER)):
        return 403, {"error": "This write came with the web UI's session cookie but without its CSRF token "
                              "(send the page's token as X-CSRF-Token); reload the page and try again",
                     "code": "AUTH_ERROR_CSRF"}
    return Principal("operator", None)


def cookie_header(name: str, value: str, *, secure: bool, max_age: int) -> str:
    """A Set-Cookie value: HttpOnly and SameSite=Strict always, Secure over HTTPS."""
    parts = [f"{name}={value}", "Path=/", "HttpOnly", "SameSite=Strict", f"Max-Age={max_age}"]
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


def describe(session: Session) -> dict[str, Any]:
    """What a page may know of its own session (never the id)."""
    return {"csrf": session.csrf, "expiresAt": int(session.expires)}
