"""SQLAlchemy tables. Names and columns follow the spec's hub_pool_identity and hub_pool_peer."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    DateTime,
    Index,
    Integer,
    String,
    Text,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    pass


class PoolIdentity(Base):
    """This node's pool identity: a singleton row (id = 'self')."""

    __tablename__ = "hub_pool_identity"
    __table_args__ = (CheckConstraint("id = 'self'", name="hub_pool_identity_singleton"),)

    id: Mapped[str] = mapped_column(String, primary_key=True, default="self")
    node_uuid: Mapped[str] = mapped_column(String(36), nullable=False, unique=True)
    public_key: Mapped[str] = mapped_column(Text, nullable=False)
    private_key_encrypted: Mapped[str] = mapped_column(Text, nullable=False)
    algorithm: Mapped[str] = mapped_column(String, nullable=False, default="ed25519")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    rotated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class PoolPeer(Base):
    """One paired or pairing peer, keyed by its canonical tailnet name."""

    __tablename__ = "hub_pool_peer"
    __table_args__ = (
        Index(
            "hub_pool_peer_node_uuid_uidx",
            "peer_node_uuid",
            unique=True,
            sqlite_where=text("peer_node_uuid IS NOT NULL"),
            postgresql_where=text("peer_node_uuid IS NOT NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=lambda: str(uuid.uuid4()))
    tailscale_device_id: Mapped[str | None] = mapped_column(String, nullable=True)
    node_fqdn: Mapped[str] = mapped_column(String, nullable=False, unique=True)
    display_name: Mapped[str | None] = mapped_column(String, nullable=True)
    direction: Mapped[str] = mapped_column(String, nullable=False)  # outbound | inbound
    status: Mapped[str] = mapped_column(String, nullable=False, default="pending")
    enabled: Mapped[bool] = mapped_column(Boolean, nullable=False, default=True)
    consecutive_failures: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    last_seen_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    last_capabilities: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    verify_token_hash: Mapped[str | None] = mapped_column(String, nullable=True)
    present_token_encrypted: Mapped[str | None] = mapped_column(Text, nullable=True)
    peer_node_uuid: Mapped[str | None] = mapped_column(Text, nullable=True)
    peer_public_key: Mapped[str | None] = mapped_column(Text, nullable=True)
    bearer_grace_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    signed_seen_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, default=utcnow, onupdate=utcnow
    )


class ApiKey(Base):
    """An API key. Only a SHA-256 of the key is stored; the key is shown once at creation."""

    __tablename__ = "hub_pool_api_key"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=lambda: str(uuid.uuid4()))
    name: Mapped[str] = mapped_column(String(100), nullable=False)
    scope: Mapped[str] = mapped_column(String(20), nullable=False)  # operator | inference | qa:read
    key_hash: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    prefix: Mapped[str] = mapped_column(String(16), nullable=False)  # shown in listings
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
