"""This node's pool identity: a stable UUID and an Ed25519 keypair, sealed at rest.

Contract (spec "Identity, addresses and rotation", "Failure modes"; protocol.md §2e "Identity",
§3 ``hub_pool_identity``):

- One row, ``id = 'self'``. ``node_uuid`` and ``public_key`` (SPKI base64) are in the clear, so
  a node that can no longer open its private key can still *verify* peers. The UUID never
  changes — not on a rename, a tailnet move, or a key rotation.
- Loading is lazy (no boot warm-up: a peerless node never mints), memoised, and never raises
  at its caller: a failure returns None, records :attr:`IdentityStore.error` and is retried
  after :data:`IDENTITY_RETRY_S`.
- A sealed key that cannot be opened degrades to ``signing_key=None`` with an error, and is
  NEVER re-minted: a new public key would unpair the whole fleet to work around a recoverable
  environment problem (spec: core-4, four days in September 2026). Recovery is :meth:`rotate`.

Sealing. The reference seals with a key derived from ``JWT_SECRET``; hubpool has no such
secret, so each node keeps a *node secret* — 32 random bytes in ``secret_path`` inside the data
directory, created mode 0600 with ``O_EXCL`` the first time a key has to be sealed. The sealing
key is HKDF-SHA256 (RFC 5869) of that secret with the node UUID as ``info``, and the PKCS8
base64 is sealed with ``nacl.secret.SecretBox`` (XSalsa20-Poly1305, random nonce) and stored as
``"v1:" + base64(nonce || ciphertext)``. HKDF rather than a password KDF (argon2, pbkdf2)
because the input is already 32 uniformly random bytes: a slow KDF only adds cost to every
load and buys nothing against a key with 256 bits of entropy. Binding the node UUID (the
reference salts with it too) means a sealed blob copied onto another node's row never opens.
A new node secret — a wiped data directory over a kept database — is the hubpool analogue of
a regenerated ``JWT_SECRET``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from nacl.secret import SecretBox
from nacl.signing import SigningKey
from sqlalchemy import Connection, insert, select, update
from sqlalchemy.exc import IntegrityError

from hubpool_core.peering.signing import (
    pkcs8_from_signing_key,
    public_key_fingerprint,
    signing_key_from_pkcs8,
    spki_from_verify_key,
)
from hubpool_core.store import Database, PoolIdentity, identity_table
from hubpool_core.store.models import from_row, values_of

log = logging.getLogger("hubpool.identity")

__all__ = [
    "IDENTITY_RETRY_S",
    "NODE_SECRET_FILE",
    "SEAL_VERSION",
    "IdentityStore",
    "Keypair",
    "node_secret_path",
    "open_sealed_key",
    "seal_private_key",
]

#: How long a failed load waits before the next attempt (the reference's IDENTITY_RETRY_MS):
#: a persistently broken store costs one query a minute, not one per request.
IDENTITY_RETRY_S = 60.0
#: File name of the node secret inside the data directory.
NODE_SECRET_FILE = "node.secret"
#: Prefix of ``private_key_encrypted``; a future sealing scheme is a parse, not a guess.
SEAL_VERSION = "v1"

_NODE_SECRET_BYTES = 32
_HKDF_SALT = b"hubpool/pool-identity-seal"
_UNDECRYPTABLE = "stored pool private key could not be decrypted (node secret changed?): "


def node_secret_path(data_dir: Path) -> Path:
    """Where the node secret lives for a data directory: ``<data_dir>/node.secret``."""
    return data_dir / NODE_SECRET_FILE


@dataclass(frozen=True)
class Keypair:
    """This node's identity as loaded.

    ``node_uuid`` is the stable pool UUID; ``public_key`` the SPKI DER in standard base64 (what
    peers pin). ``signing_key`` is None when the stored private key exists but could not be
    opened: the node can still verify peers (that needs only their keys and this UUID) but
    cannot sign, and outbound falls back to the bearer token where that is still allowed.
    """

    node_uuid: str
    public_key: str
    signing_key: SigningKey | None = field(default=None, repr=False, compare=False)

    @property
    def can_sign(self) -> bool:
        """True when :func:`hubpool_core.peering.signing.sign_headers` can use this keypair."""
        return self.signing_key is not None

    @property
    def fingerprint(self) -> str | None:
        """:func:`hubpool_core.peering.signing.public_key_fingerprint` of :attr:`public_key`."""
        return public_key_fingerprint(self.public_key)


# ── Sealing ──────────────────────────────────────────────────────────────────


def _sealing_key(node_secret: bytes, node_uuid: str) -> bytes:
    # HKDF-SHA256 with one output block (RFC 5869 §2.2–2.3): extract, then T(1).
    prk = hmac.new(_HKDF_SALT, node_secret, hashlib.sha256).digest()
    return hmac.new(prk, node_uuid.encode("utf-8") + b"\x01", hashlib.sha256).digest()


def seal_private_key(node_secret: bytes, node_uuid: str, pkcs8_b64: str) -> str:
    """Seal a PKCS8 base64 private key for ``hub_pool_identity.private_key_encrypted``.

    Returns ``"v1:<base64 of SecretBox nonce+ciphertext>"``; bound to ``node_uuid``."""
    box = SecretBox(_sealing_key(node_secret, node_uuid))
    return f"{SEAL_VERSION}:" + base64.b64encode(bytes(box.encrypt(pkcs8_b64.encode("ascii")))).decode("ascii")


def open_sealed_key(node_secret: bytes, node_uuid: str, sealed: str) -> str:
    """Inverse of :func:`seal_private_key`: the PKCS8 base64. Raises ValueError for an unknown
    version or bad encoding, and :class:`nacl.exceptions.CryptoError` when the secret or UUID
    differs from the ones it was sealed with."""
    version, sep, payload = sealed.partition(":")
    if not sep or version != SEAL_VERSION:
        raise ValueError(f"unknown seal format {version!r}")
    box = SecretBox(_sealing_key(node_secret, node_uuid))
    return box.decrypt(base64.b64decode(payload, validate=True)).decode("ascii")


# ── The store ────────────────────────────────────────────────────────────────


class IdentityStore:
    """Owns the ``hub_pool_identity`` row and the node secret; hands out the :class:`Keypair`.

    ``db`` is the node's :class:`~hubpool_core.store.Database` (already migrated);
    ``secret_path`` the node secret file (see :func:`node_secret_path`); ``clock`` a monotonic
    clock in seconds, only used for the retry timer. All methods are synchronous and
    thread-safe; they touch SQLite and the disk, so async callers may prefer ``to_thread``.
    """

    def __init__(self, db: Database, secret_path: Path, clock: Callable[[], float] = time.monotonic):
        self.db = db
        self.secret_path = Path(secret_path)
        self._clock = clock
        self._lock = threading.RLock()
        self._cached: Keypair | None = None
        self._retry_at: float | None = None
        self._observed_fqdns: dict[str, str] = {}
        #: sightings the health tick found to be names on this tailnet: what housekeeping applies
        self._vetted_fqdns: dict[str, str] = {}
        #: Why the identity is unavailable or cannot sign, for ``identityError`` on
        #: ``/pool/status``; None when a signing-capable identity is loaded.
        self.error: str | None = None

    def get(self) -> Keypair | None:
        """The identity, minting it on first use. Never raises.

        Returns the memoised :class:`Keypair` after the first successful load (including a
        loaded-but-cannot-sign one, which is kept until :meth:`rotate` or a restart). Returns
        None when the load failed (database unreachable, schema missing, unreadable node secret
        while minting…): :attr:`error` says why, and further calls return None without touching
        the store until :data:`IDENTITY_RETRY_S` has passed.

        Minting is insert-if-absent, then re-read: when two processes race, both end up with
        whichever row landed.
        """
        cached = self._cached
        if cached is not None:
            return cached
        with self._lock:
            if self._cached is not None:
                return self._cached
            if self._retry_at is not None and self._clock() < self._retry_at:
                return None
            try:
                self._cached = self._load()
            except Exception as exc:  # noqa: BLE001 - the contract is "never raises at its caller"
                self.error = f"pool identity unavailable: {exc}"
                self._retry_at = self._clock() + IDENTITY_RETRY_S
                log.warning("%s; peers will keep using the bearer token", self.error)
                return None
            self._retry_at = None
            return self._cached

    def retry_now(self) -> None:
        """The database came back: the next :meth:`get` tries at once, not after the retry window."""
        with self._lock:
            self._retry_at = None

    def can_sign(self) -> bool:
        """True when :meth:`get` yields a keypair with a usable private key."""
        identity = self.get()
        return identity is not None and identity.signing_key is not None

    def fingerprint(self) -> str | None:
        """Fingerprint of this node's public key, or None when there is no identity."""
        identity = self.get()
        return identity.fingerprint if identity is not None else None

    def check_rotatable(self) -> None:
        """Raise when :meth:`rotate` could not complete, before anything is changed.

        Rotation is destructive in two phases (every peer is told and its row deleted, then the
        key is replaced), so the caller asks first: the identity row must be readable and the
        node secret readable or, when the file is missing (the recovery case), creatable. A
        corrupt secret file or an unreadable store raises here, and the caller answers 503 with
        every pairing still in place instead of an outage plus a key that was never replaced.
        """
        with self._lock:
            self._node_secret(create=True)
            with self.db.engine.connect() as conn:
                if _identity_row(conn) is None:
                    raise LookupError("This node has no pool identity to rotate")

    def rotate(self) -> Keypair:
        """Replace the keypair, keep the UUID, stamp ``rotated_at``; returns the new keypair.

        Re-seals under the *current* node secret (creating it if missing), so this is also the
        recovery from an undecryptable key. Destructive: every peer pinned the old key, and the
        caller must send its signed ``pair/unpair`` calls BEFORE this runs — afterwards there is
        no key to sign them with. Raises LookupError when there is no identity row to rotate,
        and lets store errors propagate (an operator action should fail loudly).
        """
        with self._lock:
            secret = self._node_secret(create=True)
            with self.db.engine.begin() as conn:
                row = _identity_row(conn)
                if row is None:
                    raise LookupError("This node has no pool identity to rotate")
                signing_key = SigningKey.generate()
                public_key = spki_from_verify_key(signing_key.verify_key)
                conn.execute(update(identity_table).where(identity_table.c.id == "self").values(
                    public_key=public_key,
                    private_key_encrypted=seal_private_key(secret, row.node_uuid, pkcs8_from_signing_key(signing_key)),
                    rotated_at=datetime.now(UTC),
                ))
                keypair = Keypair(row.node_uuid, public_key, signing_key)
            self._cached = keypair
            self._retry_at = None
            self.error = None
            log.info("pool identity key rotated; node UUID %s is unchanged", keypair.node_uuid)
            return keypair

    # "Identity beats address": a verified sender FQDN that differs from the peer row is only
    # recorded here; the health tick applies it, because node_fqdn is UNIQUE and a collision
    # inside the guard would turn an authenticated request into a 500 (spec; §2e guard step 6).
    # A signature proves who sent a name, not that the name is one to dial: the tick first
    # checks it is a device of this tailnet (issue 26), and only a vetted sighting is applied.

    def note_observed_peer_fqdn(self, peer_id: str, fqdn: str) -> None:
        """Record that peer row ``peer_id`` signed a request as ``fqdn`` (already normalised)."""
        with self._lock:
            self._observed_fqdns[peer_id] = fqdn

    def take_unvetted_peer_fqdns(self) -> dict[str, str]:
        """Take and forget every sighting not yet checked: peer id -> the name it signed as."""
        with self._lock:
            taken, self._observed_fqdns = self._observed_fqdns, {}
            return taken

    def vet_observed_peer_fqdn(self, peer_id: str, fqdn: str) -> None:
        """Mark ``fqdn`` a name ``peer_id`` may be renamed to (it passed the tailnet checks)."""
        with self._lock:
            self._vetted_fqdns[peer_id] = fqdn

    def take_observed_peer_fqdn(self, peer_id: str) -> str | None:
        """Take and forget the vetted FQDN sighting for ``peer_id``; None when there is none."""
        with self._lock:
            return self._vetted_fqdns.pop(peer_id, None)

    # ── internals ──

    def _load(self) -> Keypair:
        with self.db.engine.connect() as conn:
            row = _identity_row(conn)
        if row is not None:
            return self._materialize(row)

        secret = self._node_secret(create=True)
        node_uuid = str(uuid.uuid4())
        signing_key = SigningKey.generate()
        minted = PoolIdentity(
            id="self",
            node_uuid=node_uuid,
            public_key=spki_from_verify_key(signing_key.verify_key),
            private_key_encrypted=seal_private_key(secret, node_uuid, pkcs8_from_signing_key(signing_key)),
            algorithm="ed25519",
        )
        try:
            with self.db.engine.begin() as conn:
                conn.execute(insert(identity_table).values(values_of(minted)))
        except IntegrityError:  # another process minted first: use its row
            pass

        # Re-read rather than trust the insert: under a race the row that survived may be the
        # other process's, and this node must use whichever key actually landed.
        with self.db.engine.connect() as conn:
            row = _identity_row(conn)
        if row is None:
            raise RuntimeError("pool identity row disappeared immediately after insert")
        if row.node_uuid == node_uuid:
            log.info("minted this node's pool identity (%s)", node_uuid)
        return self._materialize(row)

    def _materialize(self, row: PoolIdentity) -> Keypair:
        try:
            secret = self._node_secret(create=False)
            signing_key = signing_key_from_pkcs8(open_sealed_key(secret, row.node_uuid, row.private_key_encrypted))
        except Exception as exc:  # noqa: BLE001 - any failure to open the seal has the same remedy
            # Deliberately NOT a re-mint: the public half is what every peer pinned.
            self.error = _UNDECRYPTABLE + (str(exc) or type(exc).__name__)
            log.warning("%s; this node can verify peers but cannot sign", self.error)
            return Keypair(row.node_uuid, row.public_key, None)
        if spki_from_verify_key(signing_key.verify_key) != row.public_key:
            # Signing with it would only produce signatures every peer rejects.
            self.error = "stored pool private key does not match the stored public key; rotate the identity"
            log.warning("%s", self.error)
            return Keypair(row.node_uuid, row.public_key, None)
        self.error = None
        return Keypair(row.node_uuid, row.public_key, signing_key)

    def _node_secret(self, *, create: bool) -> bytes:
        """Read the node secret; with ``create``, mint it first if the file does not exist."""
        try:
            return self._read_secret()
        except FileNotFoundError:
            if not create:
                raise FileNotFoundError(f"node secret {self.secret_path} is missing") from None
        directory = self.secret_path.parent
        directory.mkdir(parents=True, exist_ok=True)
        secret = secrets.token_bytes(_NODE_SECRET_BYTES)
        # Written complete under a private temporary name (0600 from the first byte, O_EXCL), then
        # hard-linked into place: link() never replaces an existing file, so of two processes
        # racing exactly one secret lands, and no reader ever sees it half-written.
        temporary = directory / f".{self.secret_path.name}.{secrets.token_hex(8)}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(secret)
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(temporary, self.secret_path)
            except FileExistsError:  # another process won the race: use its secret
                return self._read_secret()
            except OSError:  # a filesystem without hard links: O_EXCL on the final name instead
                return self._create_secret_in_place(secret)
        finally:
            temporary.unlink(missing_ok=True)
        return secret

    def _create_secret_in_place(self, secret: bytes) -> bytes:
        try:
            fd = os.open(self.secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return self._read_secret()
        with os.fdopen(fd, "wb") as fh:
            fh.write(secret)
            fh.flush()
            os.fsync(fh.fileno())
        return secret

    def _read_secret(self) -> bytes:
        # A short file can only be another process mid-write on the in-place fallback; give it
        # a moment before calling the secret corrupt.
        for _ in range(20):
            data = self.secret_path.read_bytes()
            if len(data) >= _NODE_SECRET_BYTES:
                break
            time.sleep(0.01)
        if len(data) != _NODE_SECRET_BYTES:
            raise ValueError(f"node secret {self.secret_path} is {len(data)} bytes, expected {_NODE_SECRET_BYTES}")
        return data


def _identity_row(conn: Connection) -> PoolIdentity | None:
    row = conn.execute(select(identity_table).where(identity_table.c.id == "self")).first()
    return from_row(PoolIdentity, row) if row is not None else None
