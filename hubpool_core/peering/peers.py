"""Peer rows (hub_pool_peer), their public shape, and the tokens sealed at rest.

The table is the durable half of pairing. Token columns never leave this module in a
public row: ``public_peer`` is the only shape routes and logs ever see.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, overload

from nacl.secret import SecretBox
from sqlalchemy import Connection, delete, func, insert, select, update

from hubpool_core.peering.signing import public_key_fingerprint
from hubpool_core.store import Database, PoolPeer, peer_table
from hubpool_core.store.models import from_row, values_of

PENDING_REQUEST_TTL_S = 24 * 3600
MAX_PENDING_INBOUND_REQUESTS = 20
_TOKEN_SALT = b"hubpool/peer-token-seal"


def utcnow() -> datetime:
    return datetime.now(UTC)


@overload
def aware(value: datetime) -> datetime: ...
@overload
def aware(value: None) -> None: ...
def aware(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every stored time is UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def iso(value: datetime | None) -> str | None:
    value = aware(value)
    return value.isoformat(timespec="milliseconds").replace("+00:00", "Z") if value else None


def new_token() -> str:
    """A pairing token: 32 random bytes as hex, as the reference implementation sends."""
    return secrets.token_hex(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def tokens_match(presented: str, stored_hash: str | None) -> bool:
    if not stored_hash:
        return False
    return hmac.compare_digest(token_hash(presented), stored_hash)


def _box(node_secret: bytes, salt: str) -> SecretBox:
    prk = hmac.new(_TOKEN_SALT, node_secret, hashlib.sha256).digest()
    return SecretBox(hmac.new(prk, salt.encode() + b"\x01", hashlib.sha256).digest())


def seal_token(node_secret: bytes, salt: str, token: str) -> str:
    """The token a peer issued us, sealed with the node secret; salt is the peer's FQDN."""
    return "v1:" + base64.b64encode(bytes(_box(node_secret, salt).encrypt(token.encode()))).decode()


def open_token(node_secret: bytes, salt: str, sealed: str) -> str:
    version, _, payload = sealed.partition(":")
    if version != "v1":
        raise ValueError("unknown token seal format")
    return _box(node_secret, salt).decrypt(base64.b64decode(payload)).decode()


def auth_mode(row: PoolPeer) -> str:
    return "signed" if row.peer_node_uuid and row.peer_public_key else "bearer"


def public_peer(row: PoolPeer) -> dict[str, Any]:
    """Every column except the two token columns, in the wire's camelCase."""
    return {
        "id": row.id,
        "tailscaleDeviceId": row.tailscale_device_id,
        "nodeFqdn": row.node_fqdn,
        "displayName": row.display_name,
        "direction": row.direction,
        "status": row.status,
        "enabled": row.enabled,
        "consecutiveFailures": row.consecutive_failures,
        "lastSeenAt": iso(row.last_seen_at),
        "lastCapabilities": row.last_capabilities,
        "peerNodeUuid": row.peer_node_uuid,
        "peerPublicKey": row.peer_public_key,
        "peerKeyFingerprint": public_key_fingerprint(row.peer_public_key),
        "bearerGraceUntil": iso(row.bearer_grace_until),
        "signedSeenAt": iso(row.signed_seen_at),
        "authMode": auth_mode(row),
        "createdAt": iso(row.created_at),
        "updatedAt": iso(row.updated_at),
    }


class PeerRepo:
    """Queries over hub_pool_peer. Each call is its own short transaction."""

    def __init__(self, db: Database):
        self.db = db
        #: every row, as of the last write through this repo: every routed request reads the
        #: list, and a query per request cost more CPU than the rest of the relay together
        #: (docs/performance.md); every write below drops it
        self._all: list[PoolPeer] | None = None
        #: bumped before and after every write: a read that raced a write (housekeeping
        #: writes from a thread) is not kept
        self._generation = 0

    def all(self) -> list[PoolPeer]:
        cached = self._all
        if cached is None:
            generation = self._generation
            with self.db.engine.connect() as conn:
                cached = [from_row(PoolPeer, r) for r in conn.execute(_SELECT.order_by(peer_table.c.node_fqdn))]
            if generation == self._generation:
                self._all = cached
        return list(cached)

    @contextmanager
    def _writing(self) -> Iterator[None]:
        self._generation += 1
        self._all = None
        try:
            yield
        finally:
            self._generation += 1
            self._all = None

    def by_id(self, peer_id: str) -> PoolPeer | None:
        with self.db.engine.connect() as conn:
            return _one(conn, peer_table.c.id == peer_id)

    def by_fqdn(self, fqdn: str) -> PoolPeer | None:
        with self.db.engine.connect() as conn:
            return _one(conn, peer_table.c.node_fqdn == fqdn)

    def by_node_uuid(self, node_uuid: str) -> PoolPeer | None:
        # from the cached rows: the peer guard asks on every signed forward (a third of a
        # forward's CPU as a query); peer_node_uuid is unique where set
        return next((r for r in self.all() if r.peer_node_uuid == node_uuid), None)

    def resolve(self, ident: str) -> PoolPeer:
        """A row by full id, unique id prefix, or node name; LookupError says why not."""
        ident = ident.strip().lower().rstrip(".")
        rows = self.all()
        for row in rows:
            if row.id == ident or row.node_fqdn == ident:
                return row
        matches = [r for r in rows if len(ident) >= 4 and r.id.startswith(ident)]
        if len(matches) > 1:
            raise LookupError(f"{ident!r} matches {len(matches)} peers; give more of the ID")
        if not matches:
            short = [r for r in rows if r.node_fqdn.split(".")[0] == ident]
            if len(short) == 1:
                return short[0]
            raise LookupError(f"No pool peer with that id or name: {ident!r} (see `hubpool peers`)")
        return matches[0]

    def pending_inbound_count(self) -> int:
        with self.db.engine.connect() as conn:
            return conn.scalar(select(func.count()).select_from(peer_table).where(
                peer_table.c.direction == "inbound", peer_table.c.status == "pending")) or 0

    def add(self, row: PoolPeer) -> PoolPeer:
        """Insert ``row``; returns it refreshed from the database (as stored, e.g. naive times on SQLite)."""
        with self._writing(), self.db.engine.begin() as conn:
            conn.execute(insert(peer_table).values(values_of(row)))
            stored = _one(conn, peer_table.c.id == row.id)
        for name in PoolPeer.__slots__:
            setattr(row, name, getattr(stored, name))
        return row

    def update(self, peer_id: str, **changes: Any) -> PoolPeer | None:
        """Set columns of one row and stamp ``updated_at``; the refreshed row, or None when absent."""
        unknown = changes.keys() - _COLUMNS
        if unknown:
            raise TypeError(f"not a hub_pool_peer column: {', '.join(sorted(unknown))}")
        with self._writing(), self.db.engine.begin() as conn:
            done = conn.execute(update(peer_table).where(peer_table.c.id == peer_id)
                                .values({**changes, "updated_at": utcnow()}))
            if done.rowcount == 0:
                return None
            return _one(conn, peer_table.c.id == peer_id)

    def delete(self, peer_id: str) -> bool:
        with self._writing(), self.db.engine.begin() as conn:
            return conn.execute(delete(peer_table).where(peer_table.c.id == peer_id)).rowcount > 0

    def delete_all(self) -> None:
        with self._writing(), self.db.engine.begin() as conn:
            conn.execute(delete(peer_table))

    def expire_pending(self, now: datetime | None = None) -> list[str]:
        """Drop pending rows, in both directions, older than 24 hours; returns their names."""
        now = now or utcnow()
        with self._writing(), self.db.engine.begin() as conn:
            pending = conn.execute(select(peer_table.c.id, peer_table.c.node_fqdn, peer_table.c.created_at)
                                   .where(peer_table.c.status == "pending")).all()
            old = [r for r in pending if (now - aware(r.created_at)).total_seconds() >= PENDING_REQUEST_TTL_S]
            if old:
                conn.execute(delete(peer_table).where(peer_table.c.id.in_([r.id for r in old])))
        return [r.node_fqdn for r in old]


_SELECT = select(peer_table)
_COLUMNS = frozenset(PoolPeer.__slots__)


def _one(conn: Connection, where: Any) -> PoolPeer | None:
    row = conn.execute(_SELECT.where(where)).first()
    return from_row(PoolPeer, row) if row is not None else None
