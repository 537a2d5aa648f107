"""Signed peer requests: the canonical message, the headers, verification and the nonce cache.

This module is a wire contract (protocol.md §2e, §8 items 1–3). A hubpool node and a node of
the TypeScript reference implementation must sign and verify the *same bytes*, so every
function here reproduces a JavaScript behaviour exactly, not approximately:

- the message is nine lines joined by ``"\\n"`` (no trailing newline), UTF-8 encoded;
- the body hash is SHA-256 over ``JSON.stringify`` of the body with object keys sorted, which
  :func:`canonical_json` reproduces byte for byte (number formatting, string escaping, key order
  by UTF-16 code units, array-index keys first);
- keys travel as DER in standard base64 (SPKI public, PKCS8 private); nonces and signatures as
  base64url without padding.

Nothing here knows about HTTP frameworks, the database or the clock beyond an injectable
``now_ms``: the guard and the outbound client wire it in. Every verification failure carries a
reason code for logs and tests, but callers must answer all of them with the same 401
(``Invalid pool peer credentials``) — naming the failed check is an oracle (§2e) — except
``before_start``, which only a correctly signed request can reach (see :class:`Verdict`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
import secrets
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from nacl.exceptions import CryptoError
from nacl.signing import SigningKey, VerifyKey

__all__ = [
    "NODE_HEADER",
    "NONCE_HEADER",
    "PEER_HEADER",
    "PEER_NONCE_BUDGET",
    "PEER_NONCE_SWEEP_MS",
    "PEER_SIGNATURE_SKEW_MS",
    "PEER_SUSTAINED_SIGNED_RATE",
    "POOL_MESSAGE_PREAMBLE",
    "POOL_SIGNATURE_PREFIX",
    "RECIPIENT_HEADER",
    "REFUSAL_HEADER",
    "REFUSAL_IDENTITY_MISMATCH",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "UNSIGNED_BODY_MARKER",
    "NonceCache",
    "Verdict",
    "body_hash",
    "build_message",
    "canonical_json",
    "clock_ms",
    "js_number_to_string",
    "new_nonce",
    "normalize_path",
    "normalize_peer_fqdn",
    "pkcs8_from_signing_key",
    "public_key_fingerprint",
    "recipient_mismatch",
    "request_signs_body",
    "sign_headers",
    "signing_key_from_pkcs8",
    "spki_from_verify_key",
    "verify_headers",
    "verify_key_from_spki",
]

# ── Constants (protocol.md §2e) ──────────────────────────────────────────────

#: First line of every signed message: domain separation from any other signature this key makes.
POOL_MESSAGE_PREAMBLE = "ci-hub-pool-v1"
#: Line 9 on forwarding routes, whose body is not bound. Can never be a SHA-256 hex digest, so a
#: sender cannot downgrade body binding by claiming it: the receiver decides from the path alone.
UNSIGNED_BODY_MARKER = "-"
#: Prefix of ``X-Hub-Pool-Signature``. Versioned so a future algorithm change is a parse, not a guess.
POOL_SIGNATURE_PREFIX = "v1.ed25519."
#: Accepted clock skew, inclusive: exactly ±300 000 ms passes, 300 001 ms fails (§8.3).
PEER_SIGNATURE_SKEW_MS = 300_000
#: The signed-request rate one peer may sustain into a node with nothing refused. The
#: reference's single 10 000-entry cache held all peers together to ~33/s (§2e).
PEER_SUSTAINED_SIGNED_RATE = 500
#: Live nonces each sender may hold: its sustained rate over the longest a nonce can live
#: (a sender whose clock leads by the whole skew signs ``ts = now + 300 s``, kept to
#: ``ts + 300 001``), plus two seconds of slack. Only verified requests spend one.
PEER_NONCE_BUDGET = PEER_SUSTAINED_SIGNED_RATE * (2 * PEER_SIGNATURE_SKEW_MS // 1000 + 2)
#: Suggested cadence for a background :meth:`NonceCache.sweep`; pruning on insert is enough alone.
PEER_NONCE_SWEEP_MS = 30_000
#: the slices a sender's clock lags are kept in until the requests that showed them expire:
#: ten seconds, so a sender holds at most ~61 of them however fast it sends
LAG_BUCKET_MS = 10_000

#: The sender's pool node UUID; its presence selects the signed branch of the guard.
NODE_HEADER = "X-Hub-Pool-Node"
#: The sender's own node FQDN. Covered by the signature (line 5), normalised by the receiver.
PEER_HEADER = "X-Hub-Pool-Peer"
TIMESTAMP_HEADER = "X-Hub-Pool-Timestamp"
NONCE_HEADER = "X-Hub-Pool-Nonce"
SIGNATURE_HEADER = "X-Hub-Pool-Signature"
#: The recipient UUID as the sender pinned it, in the clear. Authenticates nothing: it only lets
#: a receiver say "that is not me" (spec: beta-max, 2026-09-16, 28 hours of bare 401s).
RECIPIENT_HEADER = "X-Hub-Pool-Recipient"
#: Response header on the one refusal the guard names (§2e guard step 2, §8.4).
REFUSAL_HEADER = "X-Hub-Pool-Refusal"
REFUSAL_IDENTITY_MISMATCH = "identity-mismatch"

_LOCAL_ROUTE_MARKER = "/inference/pool/local/"

# DER framing of an Ed25519 key: the constant prefix followed by the 32 raw bytes (RFC 8410).
_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")
_PKCS8_PREFIX = bytes.fromhex("302e020100300506032b657004220420")


# ── Paths and names ──────────────────────────────────────────────────────────


def normalize_path(path: str) -> str:
    """The path form both sides sign (message line 3).

    Cut at the first ``?``, then at the first ``#``; an empty result becomes ``/``. Nothing else
    is touched — no percent-decoding, no dot-segment removal, no case change — so ``path`` must
    be the request target exactly as it travels on the wire, including the ``/api`` prefix
    (the reference receiver uses Express ``originalUrl``). On a Starlette receiver that means
    ``scope["raw_path"].decode("latin-1")``, not the percent-decoded ``request.url.path``.
    """
    return path.split("?", 1)[0].split("#", 1)[0] or "/"


def request_signs_body(path: str) -> bool:
    """Whether line 9 is a body hash (True) or :data:`UNSIGNED_BODY_MARKER` (False).

    A pure function of the normalised path on both sides, never negotiated: False exactly when
    the normalised path contains ``/inference/pool/local/`` (the forwarding path, where hashing a
    megabyte batch per hop is unaffordable and recipient + nonce + timestamp already prevent
    reuse). Control routes and ``capabilities`` (even a bodyless GET) are bound (§8.1).
    """
    return _LOCAL_ROUTE_MARKER not in normalize_path(path)


# JavaScript String.prototype.trim() strips WhiteSpace and LineTerminator, which is not the
# set Python's str.strip() uses (Python strips \x1c-\x1f and \x85, and keeps \ufeff).
_JS_WHITESPACE = (
    "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
)
_HOSTNAME_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_ALL_DIGITS = re.compile(r"[0-9]+")
_MAX_FQDN_LENGTH = 253


def normalize_peer_fqdn(value: str | None) -> str | None:
    """Canonical peer FQDN, or None when ``value`` is anything but a bare multi-label hostname.

    Steps (protocol.md §8.18, the reference ``normalizePeerFqdn``): trim (JavaScript's whitespace
    set), lower-case, remove ONE trailing dot; then require at most 253 characters, two or more
    labels, each ``^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$``, and a last label that is not all
    digits (so an IPv4 literal never passes). A scheme, port, path, credentials or IP literal
    all give None. None (or a non-string) in gives None out.

    The result is line 5 of the message on the receiving side; it is also the ``node_fqdn``
    key of a peer row, so never store or dial a name that did not come through here.
    """
    if not isinstance(value, str):
        return None
    return _normalize_fqdn(value)


@lru_cache(maxsize=1024)
def _normalize_fqdn(value: str) -> str | None:
    # a pure function of the string, asked twice for every forward a peer receives (the guard
    # and the verification): the few names of a pool are worked out once (G9)
    candidate = value.strip(_JS_WHITESPACE).lower()
    if candidate.endswith("."):
        candidate = candidate[:-1]
    if not candidate or len(candidate) > _MAX_FQDN_LENGTH:
        return None
    labels = candidate.split(".")
    if len(labels) < 2 or not all(_HOSTNAME_LABEL.fullmatch(label) for label in labels):
        return None
    if _ALL_DIGITS.fullmatch(labels[-1]):
        return None
    return candidate


# ── Canonical JSON: JavaScript's JSON.stringify over sorted keys ─────────────


def js_number_to_string(value: int | float) -> str:
    """JavaScript ``String(x)`` for a number (ECMAScript Number::toString, radix 10).

    Python ``int`` values are first taken to the nearest IEEE double, as ``JSON.parse`` would,
    so ``2**64`` prints ``18446744073709552000``. Shortest round-trip digits (Python's ``repr``
    and V8 both produce them), then JS layout: integers up to 1e21 in full (``1.0`` -> ``1``,
    ``1e20`` -> ``100000000000000000000``), ``1e21`` -> ``1e+21``, ``1e-6`` -> ``0.000001``,
    ``1e-7`` -> ``1e-7``, ``-0.0`` -> ``0``; non-finite values print ``NaN``/``Infinity``/
    ``-Infinity`` (:func:`canonical_json` turns those into ``null``, as JSON.stringify does).
    """
    if isinstance(value, bool):
        raise TypeError("a bool is not a JSON number")
    if isinstance(value, int):
        if -(2**53) <= value <= 2**53:  # exactly representable: str() is already JS's output
            return str(value)
        try:
            value = float(value)
        except OverflowError:  # JSON.parse would have produced ±Infinity
            return "Infinity" if value > 0 else "-Infinity"
    x = float(value)
    if math.isnan(x):
        return "NaN"
    if x == 0:
        return "0"  # covers -0: String(-0) is "0"
    if x < 0:
        return "-" + js_number_to_string(-x)
    if math.isinf(x):
        return "Infinity"
    # repr() gives the shortest digit string that round-trips; re-lay it out the JS way.
    mantissa, _, exp_text = repr(x).partition("e")
    int_part, _, frac_part = mantissa.partition(".")
    digits = int_part + frac_part
    point = len(int_part) + (int(exp_text) if exp_text else 0)
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    k, n = len(digits), point  # x = 0.d1d2…dk × 10^n, in the spec's terms s × 10^(n−k)
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * (-n) + digits
    exponent = n - 1
    sign = "+" if exponent >= 0 else "-"
    head = digits[0] if k == 1 else digits[0] + "." + digits[1:]
    return f"{head}e{sign}{abs(exponent)}"


_SURROGATE = re.compile("[\ud800-\udfff]")


def _quote_plain(text: str) -> str:
    # For surrogate-free text Python's escaper is exactly JSON.stringify's: \b \t \n \f \r \" \\,
    # other C0 controls as lower-case \u00xx, everything else (U+2028/9, DEL, non-ASCII) raw.
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _quote(text: str) -> str:
    """A JSON string literal exactly as well-formed JSON.stringify writes it."""
    if not _SURROGATE.search(text):
        return json.dumps(text, ensure_ascii=False)
    # Surrogate code points: a JS string is UTF-16, so a high+low pair (however Python holds
    # it) is one astral character, written raw; a lone surrogate is written as \udXXX.
    raw = text.encode("utf-16-be", "surrogatepass")
    units = struct.unpack(f">{len(raw) // 2}H", raw)
    out, plain, i = [], [], 0
    while i < len(units):
        unit = units[i]
        if 0xD800 <= unit <= 0xDBFF and i + 1 < len(units) and 0xDC00 <= units[i + 1] <= 0xDFFF:
            plain.append(chr(0x10000 + ((unit - 0xD800) << 10) + (units[i + 1] - 0xDC00)))
            i += 2
            continue
        if 0xD800 <= unit <= 0xDFFF:
            out.append(_quote_plain("".join(plain)))
            plain = []
            out.append(f"\\u{unit:04x}")
        else:
            plain.append(chr(unit))
        i += 1
    out.append(_quote_plain("".join(plain)))
    return '"' + "".join(out) + '"'


_ARRAY_INDEX = re.compile(r"0|[1-9][0-9]*")
_MAX_ARRAY_INDEX = 2**32 - 2


def _utf16_units(key: str) -> bytes:
    # Big-endian UTF-16 bytes compare exactly like a sequence of code units, which is the order
    # Array.prototype.sort() uses; Python's own str order is by code point and differs for
    # astral characters against U+E000..U+FFFF.
    return key.encode("utf-16-be", "surrogatepass")


def _ordered_keys(keys: list[str]) -> list[str]:
    # canonicalize() inserts keys in Object.keys().sort() order, but JSON.stringify then walks
    # [[OwnPropertyKeys]], which puts array-index keys ("0".."4294967294", no leading zeros)
    # first in numeric order. So {"b":1,"10":2,"2":3} serialises as {"2":3,"10":2,"b":1}.
    index_keys = [k for k in keys if _ARRAY_INDEX.fullmatch(k) and int(k) <= _MAX_ARRAY_INDEX]
    if not index_keys:
        return sorted(keys, key=_utf16_units)
    index_set = set(index_keys)
    return sorted(index_keys, key=int) + sorted((k for k in keys if k not in index_set), key=_utf16_units)


def _emit(value: Any, out: list[str], ancestors: set[int]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(_quote(value))
    elif isinstance(value, (int, float)):
        text = js_number_to_string(value)
        out.append(text if text not in ("NaN", "Infinity", "-Infinity") else "null")
    elif isinstance(value, (dict, list, tuple)):
        # A genuine cycle collapses to null, like the reference canonicalizer; only ancestors
        # are tracked, so the same object on two sibling branches (a DAG) serialises fully.
        marker = id(value)
        if marker in ancestors:
            out.append("null")
            return
        ancestors.add(marker)
        if isinstance(value, dict):
            keys = list(value.keys())
            for key in keys:
                if not isinstance(key, str):
                    raise TypeError(f"canonical JSON object keys must be str, not {type(key).__name__}")
            # The reference canonicalizer copies into a fresh object with `out[key] = …`; for the
            # key "__proto__" that hits Object.prototype's setter and creates no property, so the
            # key never reaches the hash on either side. Drop it here too, or we hash other bytes.
            keys = [key for key in keys if key != "__proto__"]
            out.append("{")
            for position, key in enumerate(_ordered_keys(keys)):
                if position:
                    out.append(",")
                out.append(_quote(key))
                out.append(":")
                _emit(value[key], out, ancestors)
            out.append("}")
        else:
            out.append("[")
            for position, item in enumerate(value):
                if position:
                    out.append(",")
                _emit(item, out, ancestors)
            out.append("]")
        ancestors.discard(marker)
    else:
        raise TypeError(f"{type(value).__name__} is not a JSON value")


def canonical_json(value: Any) -> str:
    """``JSON.stringify(canonicalize(value))`` of the reference implementation, byte for byte.

    ``value`` is a parsed JSON value: dict (str keys), list or tuple, str, int, float, bool or
    None. Objects have their keys sorted recursively by UTF-16 code units (JavaScript's default
    ``sort()``), then emitted in JavaScript's own-property order, which lists array-index keys
    (``"0"`` … ``"4294967294"``) first, numerically. Arrays keep their order. No whitespace.
    Strings are escaped as JSON.stringify does (``\\b \\t \\n \\f \\r \\" \\\\`` and other C0
    controls as ``\\u00xx``; U+2028/U+2029 and all non-ASCII raw; a lone surrogate as
    ``\\udxxx``). Numbers print as JavaScript prints them (:func:`js_number_to_string`); NaN and
    ±Infinity become ``null``. A container that contains itself becomes ``null`` at the cycle.
    A ``"__proto__"`` key is omitted, because the reference canonicalizer loses it (assigning it
    sets the prototype instead of creating a property).
    ``None`` gives ``"null"`` here — the ``None`` → ``{}`` rule belongs to :func:`body_hash`.
    Raises TypeError for anything that is not a JSON value.
    """
    out: list[str] = []
    _emit(value, out, set())
    return "".join(out)


def body_hash(path: str, body: Any) -> str:
    """Line 9 of the message.

    :data:`UNSIGNED_BODY_MARKER` (``"-"``) when :func:`request_signs_body` is False for
    ``path``; otherwise lower-case hex SHA-256 of the UTF-8 of :func:`canonical_json` of
    ``body``, with ``None`` hashed as ``{}`` — a bodyless GET hashes the same on both sides
    (the sender has ``undefined``, the receiver's parser ``{}``). ``body`` is the parsed JSON
    value, never the raw bytes: key order and whitespace on the wire do not matter.
    """
    if not request_signs_body(path):
        return UNSIGNED_BODY_MARKER
    return hashlib.sha256(canonical_json({} if body is None else body).encode("utf-8")).hexdigest()


# ── The message ──────────────────────────────────────────────────────────────


def build_message(
    method: str,
    path: str,
    sender_uuid: str,
    sender_fqdn: str | None,
    recipient_uuid: str,
    timestamp_ms: int | str,
    nonce: str,
    body: Any,
) -> bytes:
    """The exact bytes an Ed25519 signature covers (protocol.md §2e "Message").

    Nine lines joined by ``"\\n"``, no trailing newline, UTF-8::

        ci-hub-pool-v1
        <METHOD upper-cased>
        <normalize_path(path)>
        <sender UUID>
        <sender FQDN>
        <recipient UUID>
        <timestamp ms, decimal>
        <nonce, as sent>
        <body_hash(path, body)>

    Fields are used verbatim apart from the method and path: ``sender_fqdn`` is NOT normalised
    here (None becomes ``""``, as the reference signs ``nodeFqdn ?? ''``) — :func:`sign_headers`
    and :func:`verify_headers` pass the normalised name. ``timestamp_ms`` as an int is printed
    in decimal; as a str it is used as given (callers pass JavaScript's ``String(Number(h))``,
    which is what :func:`verify_headers` does).
    """
    normalized = normalize_path(path)
    timestamp = timestamp_ms if isinstance(timestamp_ms, str) else js_number_to_string(timestamp_ms)
    lines = (
        POOL_MESSAGE_PREAMBLE,
        method.upper(),
        normalized,
        sender_uuid,
        sender_fqdn if sender_fqdn is not None else "",
        recipient_uuid,
        timestamp,
        nonce,
        body_hash(normalized, body),
    )
    return "\n".join(lines).encode("utf-8")


# ── Key material ─────────────────────────────────────────────────────────────


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


_B64URL = re.compile(r"[A-Za-z0-9_-]*")
_B64STD = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")


def _b64url_decode(text: str) -> bytes:
    # Strict: URL alphabet, no padding, no whitespace. Node's decoder is more lenient, but every
    # genuine sender emits exactly this form (Buffer.toString('base64url')).
    if not _B64URL.fullmatch(text) or len(text) % 4 == 1:
        raise ValueError("not unpadded base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _b64std_decode(text: str) -> bytes:
    if not isinstance(text, str) or not _B64STD.fullmatch(text.strip()):
        raise ValueError("not standard base64")
    return base64.b64decode(text.strip(), validate=True)


def new_nonce() -> str:
    """16 random bytes, base64url without padding: 22 characters (§2e)."""
    return _b64url(secrets.token_bytes(16))


def spki_from_verify_key(key: VerifyKey) -> str:
    """SPKI DER of an Ed25519 public key (44 bytes), standard base64 with padding: 60 characters.

    This is the form a peer pins (``peer_public_key``) and the form stored in
    ``hub_pool_identity.public_key``; it is what Node's ``export({type:'spki',format:'der'})``
    produces.
    """
    return base64.b64encode(_SPKI_PREFIX + bytes(key)).decode("ascii")


@lru_cache(maxsize=256)
def verify_key_from_spki(spki_b64: str) -> VerifyKey:
    """Parse :func:`spki_from_verify_key` output back into a key.

    Accepts exactly the 44-byte Ed25519 SPKI DER (the 12-byte prefix ``302a300506032b6570032100``
    and 32 key bytes) in standard base64. Raises ValueError for anything else — another curve,
    truncated DER, bad base64, None. Cached: a pinned key is parsed once, not per forward (a
    refusal, a ValueError, is never cached).
    """
    try:
        der = _b64std_decode(spki_b64)
    except (ValueError, binascii.Error) as exc:
        raise ValueError(f"public key is not base64 SPKI DER: {exc}") from None
    if len(der) != len(_SPKI_PREFIX) + 32 or not der.startswith(_SPKI_PREFIX):
        raise ValueError("public key is not an Ed25519 SPKI DER structure")
    return VerifyKey(der[len(_SPKI_PREFIX):])


def pkcs8_from_signing_key(key: SigningKey) -> str:
    """PKCS8 DER of an Ed25519 private key (prefix ``302e020100300506032b657004220420`` + the
    32-byte seed), standard base64. Secret material: only ever stored sealed (see identity.py)."""
    return base64.b64encode(_PKCS8_PREFIX + bytes(key)).decode("ascii")


def signing_key_from_pkcs8(pkcs8_b64: str) -> SigningKey:
    """Parse :func:`pkcs8_from_signing_key` output (the form Node exports). Raises ValueError."""
    try:
        der = _b64std_decode(pkcs8_b64)
    except (ValueError, binascii.Error) as exc:
        raise ValueError(f"private key is not base64 PKCS8 DER: {exc}") from None
    if len(der) != len(_PKCS8_PREFIX) + 32 or not der.startswith(_PKCS8_PREFIX):
        raise ValueError("private key is not an Ed25519 PKCS8 DER structure")
    return SigningKey(der[len(_PKCS8_PREFIX):])


def public_key_fingerprint(spki_b64: str | None) -> str | None:
    """Short human-comparable hash of a public key: the first 8 bytes of SHA-256 over the SPKI
    DER as 8 colon-separated lower-case hex pairs (``^([0-9a-f]{2}:){7}[0-9a-f]{2}$``).

    Shown beside the requester's FQDN when an operator confirms a pairing. None for None, an
    empty string or anything :func:`verify_key_from_spki` refuses, so a corrupt row renders as
    "unknown" instead of taking a status page down.
    """
    if not spki_b64:
        return None
    try:
        key = verify_key_from_spki(spki_b64)
    except ValueError:
        return None
    digest = hashlib.sha256(_SPKI_PREFIX + bytes(key)).hexdigest()[:16]
    return ":".join(digest[i:i + 2] for i in range(0, 16, 2))


# ── Signing ──────────────────────────────────────────────────────────────────


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def clock_ms(offset_ms: int = 0) -> int:
    """The pool's clock: unix milliseconds, shifted by ``offset_ms``. A node passes its
    ``HUB_POOL_DEV_CLOCK_OFFSET_MS`` (0 in production) so test rigs can run nodes whose clocks
    disagree; it reads :func:`_now_ms` at call time, so a test that freezes that sees it here."""
    return _now_ms() + offset_ms


def sign_headers(
    keypair: Any,
    method: str,
    path: str,
    sender_uuid: str,
    sender_fqdn: str | None,
    recipient_uuid: str,
    body: Any,
    *,
    now_ms: int | None = None,
    nonce: str | None = None,
) -> dict[str, str]:
    """The six headers of a signed peer request, in this order: ``X-Hub-Pool-Node``,
    ``-Peer``, ``-Timestamp``, ``-Nonce``, ``-Signature``, ``-Recipient``. Never ``Authorization``.

    ``keypair`` is an :class:`hubpool_core.peering.identity.Keypair` (anything with a ``signing_key``
    attribute), or a bare :class:`nacl.signing.SigningKey`. Raises ValueError when it cannot
    sign (``signing_key`` is None: the sealed private key could not be opened) — the caller
    decides whether a bearer fallback is allowed (§2e "Outbound credential choice").

    ``path`` is the full path being requested (``/api/inference/pool/...``); ``recipient_uuid``
    is the peer's UUID as pinned here; ``body`` is the JSON value about to be sent (None for no
    body). ``sender_fqdn`` is sent and signed in its normalised form when it normalises — the
    receiver checks the signature against ``normalize_peer_fqdn(header)``, so a sender that signed a raw
    ``Host.Example.ts.net.`` would never verify — and as given otherwise. ``now_ms`` and
    ``nonce`` are for tests; by default the wall clock and :func:`new_nonce`.
    """
    signing_key = keypair if isinstance(keypair, SigningKey) else getattr(keypair, "signing_key", None)
    if signing_key is None:
        raise ValueError("this node's pool private key is not available, so it cannot sign")
    fqdn = normalize_peer_fqdn(sender_fqdn) or (sender_fqdn if sender_fqdn is not None else "")
    timestamp = _now_ms() if now_ms is None else int(now_ms)
    nonce = new_nonce() if nonce is None else nonce
    message = build_message(method, path, sender_uuid, fqdn, recipient_uuid, timestamp, nonce, body)
    signature = signing_key.sign(message).signature
    return {
        NODE_HEADER: sender_uuid,
        PEER_HEADER: fqdn,
        TIMESTAMP_HEADER: str(timestamp),
        NONCE_HEADER: nonce,
        SIGNATURE_HEADER: POOL_SIGNATURE_PREFIX + _b64url(signature),
        RECIPIENT_HEADER: recipient_uuid,
    }


# ── Nonce cache ──────────────────────────────────────────────────────────────


class _SenderNonces:
    """One sender's spent nonces (``nonce -> expires_at_ms``), its budget's bookkeeping and
    the clock offset its accepted requests showed (for the restart rule, see :class:`NonceCache`)."""

    __slots__ = ("seen", "earliest", "lags", "known_lag_ms", "not_before_ms")

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}
        # Earliest expiry held: a full budget under a flood answers "still full" without
        # scanning every live entry per refused request.
        self.earliest: int | None = None
        #: the smallest ``receipt − timestamp`` of the accepted requests whose nonces expire in
        #: each :data:`LAG_BUCKET_MS` slice (slice index -> lag): a request's lag counts for as
        #: long as the request could be replayed, and no longer
        self.lags: dict[int, int] = {}
        #: the last offset handed out: what a sender that went quiet is judged by
        self.known_lag_ms: int | None = None
        #: this sender's restart watermark (None: the cache-wide one applies)
        self.not_before_ms: int | None = None

    def note_lag(self, lag: int, expires_at_ms: int) -> None:
        """Count ``lag`` until ``expires_at_ms`` (rounded up to its slice's end)."""
        key = expires_at_ms // LAG_BUCKET_MS
        held = self.lags.get(key)
        if held is None or lag < held:
            self.lags[key] = lag

    def live_lag(self, now: int) -> int | None:
        """The smallest lag whose request could still be replayed at ``now``; forgets the rest."""
        for key in [k for k in self.lags if (k + 1) * LAG_BUCKET_MS <= now]:
            del self.lags[key]
        return min(self.lags.values(), default=None)

    def prune(self, now: int) -> int:
        if self.earliest is None or self.earliest > now:
            return 0
        expired = [nonce for nonce, expires_at in self.seen.items() if expires_at <= now]
        for nonce in expired:
            del self.seen[nonce]
        self.earliest = min(self.seen.values(), default=None)
        return len(expired)


class NonceCache:
    """Single-use memory of the nonces each paired peer has spent inside the skew window.

    Partitioned by sender UUID, each sender with its own budget of ``budget`` live entries
    (:data:`PEER_NONCE_BUDGET`): one peer, or someone replaying one peer's traffic, can only
    ever exhaust its own budget, never another peer's. :func:`verify_headers` spends a nonce
    only AFTER the signature verified, so a stranger who knows a peer's UUID cannot spend
    anything at all (protocol.md §2e remembers before the curve check, which let junk nonces
    fill the reference's one 10 000-entry cache and lock every peer out for five minutes).

    Each entry expires at ``expires_at_ms`` (:func:`verify_headers` stores ``ts + 300 001``,
    so a nonce outlives the last ms the window admits) and is dropped once that is ``<= now``.
    A budget fails CLOSED: when full it prunes its expired entries and, if still full,
    refuses the new nonce rather than evicting a live one — evicting would reopen a replay.

    Restarts (docs/reliability.md): a node that starts without a complete record of what it
    accepted before cannot judge a signature made before it started. ``not_before_ms`` (the
    cache-wide watermark) and each sender's own watermark mark those; :meth:`admit` answers
    ``before_start`` for them unless the nonce is known. :meth:`take_lags` and
    :meth:`restore` carry a clean shutdown's nonces, and every sender's clock offset, from
    one process to the next (``hubpool_core.peering.nonce_file``).

    Thread-safe. ``clock`` returns unix milliseconds and is used when a method gets no
    ``now_ms``; inject a fake one in tests. :meth:`sweep` every :data:`PEER_NONCE_SWEEP_MS`
    frees memory after a burst; correctness does not need it.
    """

    def __init__(self, budget: int = PEER_NONCE_BUDGET, clock: Callable[[], int] = _now_ms,
                 not_before_ms: int | None = None):
        #: live entries each sender may hold
        self.budget = budget
        #: Timestamps before this were signed while this cache did not exist, so whether their
        #: nonce was already spent is unknowable: :meth:`admit` refuses them (``before_start``)
        #: for every sender without a watermark of its own. None checks nothing.
        self.not_before_ms = not_before_ms
        self._clock = clock
        self._senders: dict[str, _SenderNonces] = {}
        self._lock = threading.Lock()

    def _sender(self, sender: str) -> _SenderNonces:
        entry = self._senders.get(sender)
        if entry is None:
            entry = self._senders[sender] = _SenderNonces()
        return entry

    def admit(self, sender: str, nonce: str, timestamp_ms: int, now_ms: int | None = None) -> str | None:
        """Spend ``nonce`` for a request from ``sender`` signed at ``timestamp_ms`` (whose
        signature has been verified). None when spent now; ``"replayed"`` when already spent;
        ``"before_start"`` when it was signed before this cache could know (see the class);
        ``"nonce_cache_full"`` when the sender's budget is full of live entries."""
        now = self._clock() if now_ms is None else now_ms
        with self._lock:
            entry = self._senders.get(sender)
            if entry is not None and nonce in entry.seen:
                return "replayed"
            watermark = entry.not_before_ms if entry is not None and entry.not_before_ms is not None \
                else self.not_before_ms
            if watermark is not None and timestamp_ms < watermark:
                return "before_start"
            expires_at = timestamp_ms + PEER_SIGNATURE_SKEW_MS + 1
            refused = self._store(sender, nonce, expires_at, now)
            if refused is None:
                self._senders[sender].note_lag(now - timestamp_ms, expires_at)
            return refused

    def remember(self, sender: str, nonce: str, expires_at_ms: int, now_ms: int | None = None) -> str | None:
        """Record ``nonce`` for ``sender`` with no watermark check. None when stored;
        ``"replayed"`` when already held; ``"nonce_cache_full"`` when the budget is full."""
        now = self._clock() if now_ms is None else now_ms
        with self._lock:
            entry = self._senders.get(sender)
            if entry is not None and nonce in entry.seen:
                return "replayed"
            return self._store(sender, nonce, expires_at_ms, now)

    def _store(self, sender: str, nonce: str, expires_at_ms: int, now: int) -> str | None:
        entry = self._sender(sender)
        if len(entry.seen) >= self.budget:
            entry.prune(now)
            if len(entry.seen) >= self.budget:
                return "nonce_cache_full"
        entry.seen[nonce] = expires_at_ms
        if entry.earliest is None or expires_at_ms < entry.earliest:
            entry.earliest = expires_at_ms
        return None

    def sweep(self, now_ms: int | None = None) -> int:
        """Drop every entry with ``expires_at_ms <= now``; returns how many were dropped."""
        now = self._clock() if now_ms is None else now_ms
        with self._lock:
            dropped = sum(entry.prune(now) for entry in self._senders.values())
            for sender in [s for s, e in self._senders.items() if not e.seen and e.known_lag_ms is None
                           and not e.lags and e.not_before_ms is None]:
                del self._senders[sender]
            return dropped

    def held(self, sender: str) -> int:
        """How many live-or-unswept nonces ``sender`` holds."""
        with self._lock:
            entry = self._senders.get(sender)
            return len(entry.seen) if entry is not None else 0

    def take_lags(self, now_ms: int | None = None) -> dict[str, int]:
        """Each sender's clock offset as this node saw it: the smallest ``receipt − timestamp``
        over every accepted request of its that could still be replayed (its nonce not yet
        expired: up to 300 s past its timestamp), so after a crash no such request is signed at
        or after ``start − offset`` (issue 26: the last two ticks' smallest let a sender whose
        clock stepped back shortly before the crash have an older request replayed once). A
        sender with no such request keeps the last figure. Positive: the sender's clock lags."""
        now = self._clock() if now_ms is None else now_ms
        with self._lock:
            out: dict[str, int] = {}
            for sender, entry in self._senders.items():
                live = entry.live_lag(now)
                if live is not None:
                    entry.known_lag_ms = live
                if entry.known_lag_ms is not None:
                    out[sender] = entry.known_lag_ms
            return out

    def watermarks(self, now_ms: int | None = None) -> tuple[int | None, dict[str, int]]:
        """The watermarks still in force: the cache-wide one and each sender's. One stops
        mattering once everything signed before it has left the window (``now > W + 300 s``)."""
        now = self._clock() if now_ms is None else now_ms

        def live(value: int | None) -> int | None:
            return value if value is not None and now <= value + PEER_SIGNATURE_SKEW_MS else None

        with self._lock:
            own = {sender: w for sender, entry in self._senders.items()
                   if (w := live(entry.not_before_ms)) is not None}
            return live(self.not_before_ms), own

    def entries(self, now_ms: int | None = None) -> dict[str, dict[str, int]]:
        """Every live nonce, per sender (what a clean shutdown writes down)."""
        now = self._clock() if now_ms is None else now_ms
        with self._lock:
            return {sender: {n: e for n, e in entry.seen.items() if e > now}
                    for sender, entry in self._senders.items() if entry.seen}

    def restore(self, sender: str, nonces: Mapping[str, int], lag_ms: int | None,
                not_before_ms: int | None, now_ms: int | None = None) -> None:
        """Load what an earlier process of this node knew about ``sender``: its live nonces
        (expired ones are skipped), its clock offset, and the watermark to judge it by."""
        now = self._clock() if now_ms is None else now_ms
        with self._lock:
            entry = self._sender(sender)
            for nonce, expires_at in nonces.items():
                if expires_at > now and len(entry.seen) < self.budget:
                    entry.seen[nonce] = expires_at
            entry.earliest = min(entry.seen.values(), default=None)
            entry.known_lag_ms = lag_ms
            if lag_ms is not None and entry.earliest is not None:
                # the last process accepted these with lags no smaller than its figure: it counts
                # for as long as they could be replayed, should this process crash in turn
                entry.note_lag(lag_ms, max(entry.seen.values()))
            entry.not_before_ms = not_before_ms

    def __len__(self) -> int:
        return sum(len(entry.seen) for entry in self._senders.values())

    def __bool__(self) -> bool:
        # Always truthy: with __len__ alone an EMPTY cache is falsy, and `nonces or NonceCache()`
        # would silently swap in a fresh cache per request — a replay hole.
        return True


# ── Verification ─────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Verdict:
    """Outcome of :func:`verify_headers`.

    ``ok`` True means the request is authentic, fresh and addressed to this node; ``reason`` is
    then None and ``sender_uuid``/``sender_fqdn`` hold the authenticated sender UUID and its
    normalised FQDN (the guard records an FQDN that differs from the peer row, §2e guard step
    6). On failure ``reason`` is one of ``missing_headers``, ``bad_peer_fqdn``,
    ``bad_signature_encoding``, ``bad_timestamp``, ``expired``, ``before_start``, ``replayed``,
    ``nonce_cache_full`` or ``bad_signature`` — for logs and tests only; every one of them is the
    same 401 ``Invalid pool peer credentials`` to the caller, except ``before_start``: the
    signature verified, only this node cannot tell yet whether it was already used, so the
    guard answers a retryable 503 that no health tick counts as a credential failure.
    """

    ok: bool
    reason: str | None
    sender_uuid: str | None = None
    sender_fqdn: str | None = None


class _Headers:
    """Case-insensitive view over any header mapping (dict, Starlette Headers, httpx Headers)."""

    def __init__(self, headers: Mapping[str, str]):
        self._lower = {str(k).lower(): v for k, v in headers.items()}

    def get(self, name: str) -> str | None:
        value = self._lower.get(name.lower())
        return value if isinstance(value, str) else None


_STR_DECIMAL = re.compile(r"[+-]?(?:Infinity|[0-9]+\.?[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?)")
_STR_NON_DECIMAL = re.compile(r"0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+")


def _js_number_from_string(text: str) -> float:
    """JavaScript ``Number(text)`` (StringToNumber): NaN for anything outside its grammar."""
    text = text.strip(_JS_WHITESPACE)
    if not text:
        return 0.0
    if _STR_NON_DECIMAL.fullmatch(text):
        try:
            return float(int(text, 0))
        except OverflowError:
            return math.inf
    if _STR_DECIMAL.fullmatch(text):
        return float(text.replace("Infinity", "inf"))
    return math.nan


def recipient_mismatch(headers: Mapping[str, str], own_uuid: str) -> bool:
    """Guard step 2 (§2e): True when ``X-Hub-Pool-Recipient`` is present and is not ``own_uuid``.

    The guard then answers 401 with ``X-Hub-Pool-Refusal: identity-mismatch`` — the only named
    refusal — before looking up any peer row. An absent header (older senders) is never a
    mismatch. Never disclose ``own_uuid`` in that answer.
    """
    claimed = _Headers(headers).get(RECIPIENT_HEADER)
    return bool(claimed) and claimed != own_uuid


def verify_headers(
    headers: Mapping[str, str],
    method: str,
    path: str,
    body: Any,
    *,
    sender_public_key_b64: str,
    recipient_uuid: str,
    nonces: NonceCache,
    now_ms: int | None = None,
) -> Verdict:
    """Verify a signed peer request; cheapest refusal first (§2e "Verification order").

    ``headers`` is any mapping, looked up case-insensitively. ``path`` is the raw request
    target (see :func:`normalize_path`), ``body`` the parsed JSON body (None when there is none),
    ``sender_public_key_b64`` the SPKI key pinned for the row found by ``X-Hub-Pool-Node``, and
    ``recipient_uuid`` THIS node's UUID — a signature addressed to anyone else fails.

    Order: ``missing_headers`` (node, peer, timestamp, nonce or signature empty/absent) →
    ``bad_peer_fqdn`` (``X-Hub-Pool-Peer`` does not normalise; guard step 4) →
    ``bad_signature_encoding`` (no ``v1.ed25519.`` prefix) → ``bad_timestamp`` (JavaScript
    ``Number(ts)`` not a finite integer) → ``expired`` (``|now − ts| > 300 000``) →
    ``bad_signature_encoding`` (key or signature undecodable) → ``bad_signature`` →
    ``replayed`` / ``before_start`` (signed before this node could know: a restart, see
    :class:`NonceCache`) / ``nonce_cache_full`` (the sender's budget is full). The nonce is
    spent only AFTER the curve check, and in the sender's own budget: the reference spends it
    first, so junk nonces under a known UUID filled its one cache and refused every peer; an
    Ed25519 verification costs tens of microseconds, a lockout five minutes. Line 7 of the
    rebuilt message is ``String(Number(ts))``, as in the reference, so ``"1700000000000"`` and
    ``"1.7e12"`` sign the same line. Does not check ``X-Hub-Pool-Recipient``; see
    :func:`recipient_mismatch`.
    """
    view = _Headers(headers)
    sender_uuid = view.get(NODE_HEADER)
    claimed_fqdn = view.get(PEER_HEADER)
    timestamp = view.get(TIMESTAMP_HEADER)
    nonce = view.get(NONCE_HEADER)
    signature = view.get(SIGNATURE_HEADER)
    if not (sender_uuid and claimed_fqdn and timestamp and nonce and signature):
        return Verdict(False, "missing_headers")
    sender_fqdn = normalize_peer_fqdn(claimed_fqdn)
    if sender_fqdn is None:
        return Verdict(False, "bad_peer_fqdn")
    if not signature.startswith(POOL_SIGNATURE_PREFIX):
        return Verdict(False, "bad_signature_encoding")

    value = _js_number_from_string(timestamp)
    if not math.isfinite(value) or not value.is_integer():
        return Verdict(False, "bad_timestamp")
    timestamp_ms = int(value)
    now = _now_ms() if now_ms is None else now_ms
    if abs(now - timestamp_ms) > PEER_SIGNATURE_SKEW_MS:
        return Verdict(False, "expired")

    try:
        key = verify_key_from_spki(sender_public_key_b64)
        signature_bytes = _b64url_decode(signature[len(POOL_SIGNATURE_PREFIX):])
    except (ValueError, binascii.Error):
        return Verdict(False, "bad_signature_encoding")

    message = build_message(
        method, path, sender_uuid, sender_fqdn, recipient_uuid, js_number_to_string(value), nonce, body
    )
    try:
        key.verify(message, signature_bytes)
    except (CryptoError, ValueError, TypeError):
        # BadSignatureError is a CryptoError. A wrong-length signature is a plain "false" in
        # Node's verify, so it lands here too rather than under bad_signature_encoding.
        return Verdict(False, "bad_signature")
    # Spent only now, in the sender's own budget, and kept through ts + 300 000 inclusive: the
    # window still admits a request at exactly that ms (see NonceCache.admit).
    refused = nonces.admit(sender_uuid, nonce, timestamp_ms, now)
    if refused is not None:
        return Verdict(False, refused, sender_uuid=sender_uuid, sender_fqdn=sender_fqdn)
    return Verdict(True, None, sender_uuid=sender_uuid, sender_fqdn=sender_fqdn)
