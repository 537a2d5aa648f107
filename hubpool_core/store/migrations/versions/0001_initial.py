"""Initial schema: hub_pool_identity, hub_pool_peer, hub_pool_api_key.

Revision ID: 0001
Revises:
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hub_pool_identity",
        sa.Column("id", sa.String(), primary_key=True, server_default="self"),
        sa.Column("node_uuid", sa.String(36), nullable=False, unique=True),
        sa.Column("public_key", sa.Text(), nullable=False),
        sa.Column("private_key_encrypted", sa.Text(), nullable=False),
        sa.Column("algorithm", sa.String(), nullable=False, server_default="ed25519"),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
        sa.Column("rotated_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("id = 'self'", name="hub_pool_identity_singleton"),
    )
    op.create_table(
        "hub_pool_peer",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("tailscale_device_id", sa.String(), nullable=True),
        sa.Column("node_fqdn", sa.String(), nullable=False),
        sa.Column("display_name", sa.String(), nullable=True),
        sa.Column("direction", sa.String(), nullable=False),
        sa.Column("status", sa.String(), nullable=False, server_default="pending"),
        sa.Column("enabled", sa.Boolean(), nullable=False, server_default=sa.true()),
        sa.Column("consecutive_failures", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_capabilities", sa.JSON(), nullable=True),
        sa.Column("verify_token_hash", sa.String(), nullable=True),
        sa.Column("present_token_encrypted", sa.Text(), nullable=True),
        sa.Column("peer_node_uuid", sa.Text(), nullable=True),
        sa.Column("peer_public_key", sa.Text(), nullable=True),
        sa.Column("bearer_grace_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("signed_seen_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.UniqueConstraint("node_fqdn", name="hub_pool_peer_node_fqdn_unique"),
    )
    op.create_index(
        "hub_pool_peer_node_uuid_uidx",
        "hub_pool_peer",
        ["peer_node_uuid"],
        unique=True,
        sqlite_where=sa.text("peer_node_uuid IS NOT NULL"),
        postgresql_where=sa.text("peer_node_uuid IS NOT NULL"),
    )
    op.create_table(
        "hub_pool_api_key",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("scope", sa.String(20), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("hub_pool_api_key")
    op.drop_index("hub_pool_peer_node_uuid_uidx", table_name="hub_pool_peer")
    op.drop_table("hub_pool_peer")
    op.drop_table("hub_pool_identity")
