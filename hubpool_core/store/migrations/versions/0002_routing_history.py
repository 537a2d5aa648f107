"""Routing history: settled routing-log rows, kept when HUB_POOL_HISTORY is on (docs/history.md).

Revision ID: 0002
Revises: 0001
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hub_pool_routing_history",
        sa.Column("seq", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("boot_id", sa.String(36), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("direction", sa.String(10), nullable=False),
        sa.Column("path", sa.String(200), nullable=True),
        sa.Column("model", sa.String(300), nullable=True),
        sa.Column("node", sa.String(300), nullable=True),
        sa.Column("outcome", sa.String(20), nullable=False),
        sa.Column("status", sa.Integer(), nullable=True),
        sa.Column("row", sa.JSON(), nullable=False),
    )
    op.create_index("hub_pool_routing_history_at_idx", "hub_pool_routing_history", ["at"])
    op.create_index("hub_pool_routing_history_request_idx", "hub_pool_routing_history", ["request_id"])


def downgrade() -> None:
    op.drop_index("hub_pool_routing_history_request_idx", table_name="hub_pool_routing_history")
    op.drop_index("hub_pool_routing_history_at_idx", table_name="hub_pool_routing_history")
    op.drop_table("hub_pool_routing_history")
