"""SQLAlchemy Core tables and the plain row objects read from them.

Names and columns follow the spec's hub_pool_identity and hub_pool_peer. The node only reads
and writes whole rows of three tables, so there is no ORM: importing ``sqlalchemy.orm`` costs
about 6 MB resident in every `hubpool serve` process (docs/performance.md G7). The repos
(peers, credentials, identity) run Core statements on these tables and turn rows into the
dataclasses below, whose fields are exactly the tables' columns.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    text,
)


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id() -> str:
    return str(uuid.uuid4())


#: the schema the alembic migrations (store/migrations/versions) build; env.py compares against it
metadata = MetaData()

identity_table = Table(
    "hub_pool_identity",
    metadata,
    Column("id", String, primary_key=True, default="self"),
    Column("node_uuid", String(36), nullable=False, unique=True),
    Column("public_key", Text, nullable=False),
    Column("private_key_encrypted", Text, nullable=False),
    Column("algorithm", String, nullable=False, default="ed25519"),
    Column("created_at", DateTime(timezone=True), default=utcnow),
    Column("rotated_at", DateTime(timezone=True), nullable=True),
    CheckConstraint("id = 'self'", name="hub_pool_identity_singleton"),
)

peer_table = Table(
    "hub_pool_peer",
    metadata,
    Column("id", String(36), primary_key=True, default=new_id),
    Column("tailscale_device_id", String, nullable=True),
    Column("node_fqdn", String, nullable=False, unique=True),
    Column("display_name", String, nullable=True),
    Column("direction", String, nullable=False),  # outbound | inbound
    Column("status", String, nullable=False, default="pending"),
    Column("enabled", Boolean, nullable=False, default=True),
    Column("consecutive_failures", Integer, nullable=False, default=0),
    Column("last_seen_at", DateTime(timezone=True), nullable=True),
    Column("last_capabilities", JSON, nullable=True),
    Column("verify_token_hash", String, nullable=True),
    Column("present_token_encrypted", Text, nullable=True),
    Column("peer_node_uuid", Text, nullable=True),
    Column("peer_public_key", Text, nullable=True),
    Column("bearer_grace_until", DateTime(timezone=True), nullable=True),
    Column("signed_seen_at", DateTime(timezone=True), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, default=utcnow),
    # Core applies onupdate to every UPDATE statement that does not set the column itself
    Column("updated_at", DateTime(timezone=True), nullable=False, default=utcnow, onupdate=utcnow),
    Index(
        "hub_pool_peer_node_uuid_uidx",
        "peer_node_uuid",
        unique=True,
        sqlite_where=text("peer_node_uuid IS NOT NULL"),
        postgresql_where=text("peer_node_uuid IS NOT NULL"),
    ),
)

api_key_table = Table(
    "hub_pool_api_key",
    metadata,
    Column("id", String(36), primary_key=True, default=new_id),
    Column("name", String(100), nullable=False),
    Column("scope", String(20), nullable=False),  # operator | inference | qa:read
    Column("key_hash", String(64), nullable=False, unique=True),
    Column("prefix", String(16), nullable=False),  # shown in listings
    Column("created_at", DateTime(timezone=True), nullable=False, default=utcnow),
    Column("last_used_at", DateTime(timezone=True), nullable=True),
    Column("revoked_at", DateTime(timezone=True), nullable=True),
)


history_table = Table(
    "hub_pool_routing_history",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("request_id", String(64), nullable=False),
    Column("boot_id", String(36), nullable=False),  # which process of the node recorded it
    Column("at", DateTime(timezone=True), nullable=False),
    Column("direction", String(10), nullable=False),
    Column("path", String(200), nullable=True),
    Column("model", String(300), nullable=True),
    Column("node", String(300), nullable=True),
    Column("outcome", String(20), nullable=False),
    Column("status", Integer, nullable=True),
    # the routing-log row exactly as the ring held it when it settled (metadata only, by the
    # ring's own contract); the columns above are copies for filtering
    Column("row", JSON, nullable=False),
    Index("hub_pool_routing_history_at_idx", "at"),
    Index("hub_pool_routing_history_request_idx", "request_id"),
)


# The row classes: keyword-only, with the defaults the columns have. eq=False keeps identity
# comparison and hashing (rows go into sets and dict keys); repr=False keeps sealed tokens and
# keys out of any log line that prints a row.


@dataclass(slots=True, kw_only=True, eq=False, repr=False)
class PoolIdentity:
    """This node's pool identity: a singleton row (id = 'self')."""

    id: str = "self"
    node_uuid: str
    public_key: str
    private_key_encrypted: str
    algorithm: str = "ed25519"
    created_at: datetime | None = field(default_factory=utcnow)
    rotated_at: datetime | None = None


@dataclass(slots=True, kw_only=True, eq=False, repr=False)
class PoolPeer:
    """One paired or pairing peer, keyed by its canonical tailnet name."""

    id: str = field(default_factory=new_id)
    tailscale_device_id: str | None = None
    node_fqdn: str
    display_name: str | None = None
    direction: str  # outbound | inbound
    status: str = "pending"
    enabled: bool = True
    consecutive_failures: int = 0
    last_seen_at: datetime | None = None
    last_capabilities: dict | None = None
    verify_token_hash: str | None = None
    present_token_encrypted: str | None = None
    peer_node_uuid: str | None = None
    peer_public_key: str | None = None
    bearer_grace_until: datetime | None = None
    signed_seen_at: datetime | None = None
    created_at: datetime = field(default_factory=utcnow)
    updated_at: datetime = field(default_factory=utcnow)


@dataclass(slots=True, kw_only=True, eq=False, repr=False)
class ApiKey:
    """An API key. Only a SHA-256 of the key is stored; the key is shown once at creation."""

    id: str = field(default_factory=new_id)
    name: str
    scope: str  # operator | inference | qa:read
    key_hash: str
    prefix: str  # shown in listings
    created_at: datetime = field(default_factory=utcnow)
    last_used_at: datetime | None = None
    revoked_at: datetime | None = None


Row = TypeVar("Row", PoolIdentity, PoolPeer, ApiKey)


def from_row(cls: type[Row], row: Any) -> Row:
    """A row object from a result row of its table (every column selected)."""
    return cls(**row._mapping)


def values_of(obj: PoolIdentity | PoolPeer | ApiKey) -> dict[str, Any]:
    """Every column of a row object, for an INSERT."""
    return {name: getattr(obj, name) for name in obj.__slots__}
