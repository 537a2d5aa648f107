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
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any

from hubpool_core.access.credentials import KeyStore, Principal

#: twelve hours: long enough for a working day at the dashboard, short enough that a
#: forgotten browser does not stay signed in for good
SESSION_SECONDS = 12 * 3600
MAX_SESSIONS = 64  # a node has few operators; the oldest goes first beyond this
#: wrong keys allowed per minute from one source before sign-in answers it 429
MAX_FAILURES = 10
FAILURE_WINDOW_SECONDS = 60
#: sources whose wrong keys are counted at once (each holds at most MAX_FAILURES times)
MAX_SOURCES = 1024
#: the one source for every caller the node cannot tell apart (behind an untrusted proxy)
UNIDENTIFIED = "unidentified"
#: where new sources are counted while every tracked source is itself held back
OVERFLOW = "overflow"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf"


@dataclass
class Session:
    """One signed-in browser."""

    sid: str
    csrf: str
    expires: float
    created: float = field(default_factory=time.time)


def _source_key(source: str | None) -> str:
    # prefixed, so no address a header names can be mistaken for the shared keys
    return f"ip:{source}" if source else UNIDENTIFIED


class SignInLimiter:
    """Wrong operator keys per source, :data:`MAX_FAILURES` a minute each (issue 26).

    Keyed on the source as the PIN cooldown is (spec "What a source means"): the caller's IP
    where it can be honestly told (``access.guards.source_ip``), else :data:`UNIDENTIFIED`, one
    count for every caller behind a proxy this node does not trust. One counter for everyone
    let ten wrong keys from anywhere lock the operator out of the web UI.

    Bounded: at most :data:`MAX_SOURCES` sources, ordered by their last wrong key. A source
    idle for the window is forgotten; when the table is full, the oldest source that is not
    held back makes room, so a source that is held back cannot be freed by a flood of others.
    Only when every tracked source is held back are new ones counted together
    (:data:`OVERFLOW`): that many sources guessing at once is an attack, and bounding its
    total rate is worth making a new source wait out the minute."""

    def __init__(self) -> None:
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._failures)

    def _prune(self, now: float) -> None:
        while self._failures:
            key, times = next(iter(self._failures.items()))
            if now - times[-1] < FAILURE_WINDOW_SECONDS:
                return
            del self._failures[key]

    def _held(self, times: deque[float], now: float) -> bool:
        return sum(1 for t in times if now - t < FAILURE_WINDOW_SECONDS) >= MAX_FAILURES

    def _slot(self, source: str, now: float, *, make_room: bool) -> str:
        """The key ``source`` is counted under now."""
        self._prune(now)
        if source in self._failures or len(self._failures) < MAX_SOURCES:
            return source
        for key, times in self._failures.items():  # oldest last wrong key first
            if key != OVERFLOW and not self._held(times, now):
                if make_room:
                    del self._failures[key]
                return source
        return OVERFLOW

    def allowed(self, source: str | None) -> bool:
        """False while ``source`` (None: not identifiable) has had too many wrong keys this minute."""
        now = time.time()
        times = self._failures.get(self._slot(_source_key(source), now, make_room=False))
        return times is None or not self._held(times, now)

    def failed(self, source: str | None) -> None:
        """Count one wrong key from ``source``."""
        now = time.time()
        key = self._slot(_source_key(source), now, make_room=True)
        times = self._failures.pop(key, None) or deque(maxlen=MAX_FAILURES)
        times.append(now)
        self._failures[key] = times  # last: the table is ordered by each source's last wrong key


class SessionStore:
    """The signed-in browsers of one node."""

    def __init__(self, keys: KeyStore):
        self._sessions: dict[str, Session] = {}
        self.sign_ins = SignInLimiter()
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

    def sign_in_allowed(self, source: str | None) -> bool:
        """False after too many wrong keys from ``source`` in the last minute (an env operator
        key may be short); None is every caller the node cannot tell apart."""
        return self.sign_ins.allowed(source)

    def failed_sign_in(self, source: str | None) -> None:
        """Count one wrong key from ``source`` toward its limit."""
        self.sign_ins.failed(source)

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
