"""The pairing PIN and the per-source cooldown in front of it (protocol.md §2f; spec "The PIN,
and what it actually buys").

``POST /pair/request`` is the only unauthenticated write in the pool. A valid PIN is what lets
it create anything; a wrong guess creates nothing. Twenty bits are only safe because of what
surrounds them, and each rule below is one of those walls:

- six digits from ``secrets.randbelow(1_000_000)`` (uniform; ``token_bytes % 10**6`` is biased);
- ten minutes (:data:`PAIRING_PIN_TTL_MS`), one live PIN, single use, held in memory only;
- :data:`PAIRING_PIN_MAX_ATTEMPTS` wrong guesses destroy it, whoever makes them, so one PIN's
  total exposure is 5/10⁶ however many sources try — this ceiling is the real bound;
- a per-source cooldown (:class:`SourceCooldown`) as the second layer, keyed on the claimed FQDN
  and, when the caller's IP can be honestly identified, on the IP.

Wrong, expired, already-used and none-outstanding are indistinguishable (the same 401,
:data:`PIN_FAILURE_MESSAGE`): saying whether a PIN is even outstanding would make the space
searchable in two steps. The cooldown's 429 (:data:`PIN_COOLDOWN_MESSAGE`) is deliberately
distinguishable — it is about the caller, not the secret. Everything takes ``now_ms`` (unix
milliseconds) explicitly, so tests need no real clock.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

__all__ = [
    "COOLDOWN_BASE_MS",
    "COOLDOWN_MAX_MS",
    "COOLDOWN_STRIKES",
    "COOLDOWN_STRIKE_WINDOW_MS",
    "MAX_COOLDOWN_KEYS",
    "PAIRING_PIN_MAX_ATTEMPTS",
    "PAIRING_PIN_TTL_MS",
    "PIN_COOLDOWN_MESSAGE",
    "PIN_FAILURE_MESSAGE",
    "PairingPin",
    "SourceCooldown",
    "check_pairing_pin",
    "is_pin_shape",
    "iso_from_ms",
    "source_keys",
]

#: How long a minted PIN is good for: long enough to walk to the other machine.
PAIRING_PIN_TTL_MS = 600_000
#: Wrong guesses one PIN survives; the 5th destroys it.
PAIRING_PIN_MAX_ATTEMPTS = 5
#: The uniform 401 text for every PIN failure (§2f).
PIN_FAILURE_MESSAGE = "Invalid or expired pairing PIN"
#: The 429 text for a cooling source (§2f).
PIN_COOLDOWN_MESSAGE = "Too many failed pairing attempts from this source; try again shortly"

#: The wire shape of a PIN: exactly six ASCII digits (protocol §2d ``/^\d{6}$/``, where JavaScript's
#: ``\d`` is ASCII only). ``str.isdigit`` would also take "١٢٣٤٥٦" or "１２３４５６", which can never
#: match a minted PIN but would strike the cooldown and spend one of the PIN's five tries.
PIN_SHAPE = re.compile(r"[0-9]{6}")
PIN_SHAPE_MESSAGE = "pin must be exactly six ASCII digits (0-9)"


def is_pin_shape(value: object) -> bool:
    """True for a string of exactly six ASCII digits, the only PIN a node judges."""
    return isinstance(value, str) and PIN_SHAPE.fullmatch(value) is not None


# The reference reuses its ServingQuarantine limiter with these constants (§2f).
#: Strikes inside the window before a source is first withheld.
COOLDOWN_STRIKES = 2
#: A strike older than this no longer counts toward the threshold.
COOLDOWN_STRIKE_WINDOW_MS = 300_000
#: First withholding period; doubles per round.
COOLDOWN_BASE_MS = 60_000
#: Ceiling on the doubling: 60 s, 2 min, 4 min, 8 min, 15 min, 15 min…
COOLDOWN_MAX_MS = 900_000
#: Keys the cooldown holds at once (hubpool's bound; each is a few hundred bytes).
MAX_COOLDOWN_KEYS = 4096


def iso_from_ms(ms: int) -> str:
    """JavaScript ``new Date(ms).toISOString()``: ``YYYY-MM-DDTHH:MM:SS.mmmZ`` in UTC."""
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _hash_pin(salt: str, pin: str) -> str:
    return hashlib.sha256(f"{salt}:{pin}".encode()).hexdigest()


@dataclass
class _ActivePin:
    digest: str
    salt: str
    expires_at_ms: int
    attempts: int = 0


class PairingPin:
    """The one outstanding pairing PIN, if any. In memory only: a restart cancels it, which is
    right — the operator is standing at the screen. Thread-safe.

    The digits are never stored: only ``sha256("<salt>:<pin>")`` hex with a fresh 16-byte hex
    salt, so a heap dump does not hand them over. (SHA-256, not a slow KDF: 20 bits survive no
    offline attack anyway; the attempt ceiling is the defence, and this runs on a request path.)
    """

    def __init__(self) -> None:
        self._active: _ActivePin | None = None
        self._lock = threading.Lock()

    def mint(self, now_ms: int) -> tuple[str, int]:
        """Mint a PIN, replacing any outstanding one; returns ``(digits, expires_at_ms)``.

        The only place the digits ever appear: return them to the operator once and forget them.
        ``expires_at_ms = now_ms + PAIRING_PIN_TTL_MS``.
        """
        pin = f"{secrets.randbelow(1_000_000):06d}"
        salt = secrets.token_hex(16)
        expires_at = now_ms + PAIRING_PIN_TTL_MS
        with self._lock:
            self._active = _ActivePin(_hash_pin(salt, pin), salt, expires_at)
        return pin, expires_at

    def consume(self, candidate: str, now_ms: int) -> bool:
        """True exactly once, for the outstanding PIN before it expires; the PIN is then gone.

        False — and nothing that tells the cases apart — when the candidate is wrong, the PIN
        has expired (``now_ms >= expires_at``), was already used, was destroyed, or none was
        minted. The attempt is counted BEFORE the comparison, and the 5th wrong attempt destroys
        the PIN, even for a caller who would have guessed right next. Constant-time compare.
        """
        with self._lock:
            self._sweep(now_ms)
            active = self._active
            if active is None:
                return False
            active.attempts += 1
            presented = _hash_pin(active.salt, candidate if isinstance(candidate, str) else "")
            if not hmac.compare_digest(presented, active.digest):
                if active.attempts >= PAIRING_PIN_MAX_ATTEMPTS:
                    self._active = None
                return False
            self._active = None
            return True

    def cancel(self) -> bool:
        """Drop the outstanding PIN (the operator closing the window); True if there was one."""
        with self._lock:
            had = self._active is not None
            self._active = None
            return had

    def status(self, now_ms: int) -> dict[str, object]:
        """``{"active": bool, "expiresAt": ISO-8601 str | None}`` for ``/pool/status``'s
        ``pairingPin``. Never the digits."""
        with self._lock:
            self._sweep(now_ms)
            active = self._active
            return {"active": active is not None, "expiresAt": iso_from_ms(active.expires_at_ms) if active else None}

    def sweep(self, now_ms: int) -> bool:
        """Drop an expired PIN (run on each health tick); True if one was dropped. Only
        reclaims memory: :meth:`consume` enforces expiry itself, so sweep lag is harmless."""
        with self._lock:
            return self._sweep(now_ms)

    def _sweep(self, now_ms: int) -> bool:
        if self._active is not None and now_ms >= self._active.expires_at_ms:
            self._active = None
            return True
        return False


@dataclass
class _Cooldown:
    strikes: int
    last_strike_ms: int
    withheld_until_ms: int  # 0 while only accumulating strikes
    rounds: int  # withholdings served without an intervening success: the backoff exponent


class SourceCooldown:
    """Strike-then-exponential-backoff limiter for pairing attempts (§2f; the reference's
    ``ServingQuarantine`` with its constants).

    :data:`COOLDOWN_STRIKES` (2) strikes within :data:`COOLDOWN_STRIKE_WINDOW_MS` withhold a key
    for :data:`COOLDOWN_BASE_MS` (60 s); once a key has been withheld, a single strike after the
    withholding ends withholds it again for twice as long, up to :data:`COOLDOWN_MAX_MS`
    (15 min). Strikes while withheld never extend the sentence. A key with no strike and no
    withholding for the strike window (counted from the later of its last strike and the end of
    its last withholding) is forgotten, backoff included; :meth:`clear` (on a correct PIN)
    forgets it at once. Keys are opaque — use :func:`source_keys`. At most
    :data:`MAX_COOLDOWN_KEYS` are held (:meth:`_make_room`). Thread-safe.

    The pinned behaviour: a source's third wrong guess meets a block (two strikes, then
    :meth:`blocked` is True), and ``now + 60_001`` clears it.
    """

    def __init__(self) -> None:
        self._entries: dict[str, _Cooldown] = {}
        self._lock = threading.Lock()

    def strike(self, key: str, now_ms: int) -> int:
        """Record a failed attempt from ``key``. Returns the withholding period in ms when this
        strike started one (for a single log line), else 0."""
        with self._lock:
            self._prune(now_ms)
            # popped and put back last: the table runs from the least recently struck key
            entry = self._entries.pop(key, None)
            if entry is None and len(self._entries) >= MAX_COOLDOWN_KEYS:
                self._make_room(now_ms)
            within = entry is not None and now_ms - entry.last_strike_ms <= COOLDOWN_STRIKE_WINDOW_MS
            strikes = (entry.strikes if entry is not None and within else 0) + 1
            rounds = entry.rounds if entry else 0
            withheld_until = entry.withheld_until_ms if entry else 0
            # A key already withheld once has spent its benefit of the doubt: one strike settles it.
            threshold = 1 if rounds > 0 else COOLDOWN_STRIKES
            if withheld_until > now_ms or strikes < threshold:
                self._entries[key] = _Cooldown(strikes, now_ms, withheld_until, rounds)
                return 0
            period = min(COOLDOWN_BASE_MS * 2**rounds, COOLDOWN_MAX_MS)
            self._entries[key] = _Cooldown(0, now_ms, now_ms + period, rounds + 1)
            return period

    def blocked(self, key: str, now_ms: int) -> bool:
        """True while ``key`` is withheld (until its period ends, exclusive)."""
        with self._lock:
            self._prune(now_ms)
            entry = self._entries.get(key)
            return entry is not None and entry.withheld_until_ms > now_ms

    def clear(self, key: str) -> bool:
        """Forget ``key`` entirely — strikes and backoff; True if anything was held."""
        with self._lock:
            return self._entries.pop(key, None) is not None

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        # Always truthy, so `cooldown or SourceCooldown()` can never swap in an empty limiter.
        return True

    def _make_room(self, now_ms: int) -> None:
        """Forget one key: the least recently struck that is not withheld, else the least
        recently struck. Keys are the caller's to choose (a claimed FQDN), so their number is
        bounded (issue 26); a caller cannot free its own address key this way, because a
        withheld caller is refused before it can strike, and the per-PIN ceiling of five wrong
        guesses, not this table, is what bounds a PIN's exposure."""
        victim = next((k for k, e in self._entries.items() if e.withheld_until_ms <= now_ms),
                      next(iter(self._entries)))
        del self._entries[victim]

    def _prune(self, now_ms: int) -> None:
        # Keys are caller-chosen (a claimed FQDN is free to vary), so idle entries must go. The
        # idle window runs from the END of the last withholding, not from the last strike: a
        # cooling source is refused before it can strike, so counting from the strike (as the
        # reference's ServingQuarantine does) forgets every withholding longer than the window
        # the moment it ends — the backoff would reset after 8 min and never reach the 15-min
        # ceiling §2f and the spec describe.
        stale = [
            key
            for key, entry in self._entries.items()
            if entry.withheld_until_ms <= now_ms
            and now_ms - max(entry.last_strike_ms, entry.withheld_until_ms) > COOLDOWN_STRIKE_WINDOW_MS
        ]
        for key in stale:
            del self._entries[key]


def source_keys(claimed_fqdn: str | None = None, ip: str | None = None) -> list[str]:
    """Cooldown keys for a caller: ``fqdn:<claimed>`` and ``ip:<ip>``, each only when given.

    Pass ``ip`` only when the node can honestly identify the caller (``HUB_TRUST_PROXY`` set,
    or no reverse-proxy provenance headers such as ``cf-ray``/``x-forwarded-for``): behind a
    proxy every caller shares the proxy's address, and keying on it would be a global lockout.
    """
    keys = []
    if claimed_fqdn:
        keys.append(f"fqdn:{claimed_fqdn}")
    if ip:
        keys.append(f"ip:{ip}")
    return keys


def check_pairing_pin(
    pin: PairingPin, cooldown: SourceCooldown, candidate: str, now_ms: int, keys: list[str]
) -> Literal["ok", "refused", "cooling"]:
    """The whole §2f check in the order the reference runs it, for ``pair/request``.

    ``"cooling"`` (answer 429 :data:`PIN_COOLDOWN_MESSAGE`) when any of ``keys`` is blocked —
    the PIN is not touched, so a cooling source cannot burn attempts. Otherwise the PIN is
    consumed: ``"ok"`` clears every key's strikes; ``"refused"`` (answer 401
    :data:`PIN_FAILURE_MESSAGE`) strikes every key — including when no PIN is outstanding.
    """
    if any(cooldown.blocked(key, now_ms) for key in keys):
        return "cooling"
    if pin.consume(candidate, now_ms):
        for key in keys:
            cooldown.clear(key)
        return "ok"
    for key in keys:
        cooldown.strike(key, now_ms)
    return "refused"
