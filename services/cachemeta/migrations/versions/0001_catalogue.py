"""The catalogue: nodes, blocks and replicas.

Revision ID: 0001
Revises:
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "nodes",
        sa.Column("node_id", sa.String(255), primary_key=True),
        sa.Column("role", sa.String(64), nullable=False, server_default=""),
        sa.Column("epoch", sa.String(255), nullable=False, server_default=""),
        sa.Column("last_seen", sa.Float, nullable=False),
        sa.Column("needs_resync", sa.Boolean, nullable=False, server_default=sa.true()),
        sa.Column("tiers", sa.JSON, nullable=False),
    )
    op.create_table(
        "blocks",
        sa.Column("hash", sa.LargeBinary(16), primary_key=True),
        sa.Column("parent_hash", sa.LargeBinary(16), nullable=False),
        sa.Column("token_ids", sa.LargeBinary, nullable=False),
        sa.Column("num_bytes", sa.BigInteger, nullable=False),
        sa.Column("checksum", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("last_access", sa.Float, nullable=False),
        sa.Column("access_count", sa.BigInteger, nullable=False, server_default="0"),
    )
    # No foreign keys: see models.Replica.
    op.create_table(
        "replicas",
        sa.Column("block_hash", sa.LargeBinary(16), primary_key=True),
        sa.Column("node_id", sa.String(255), primary_key=True),
        sa.Column("tier", sa.String(16), primary_key=True),
    )
    op.create_index("ix_replicas_node_id", "replicas", ["node_id"])


def downgrade() -> None:
    op.drop_index("ix_replicas_node_id", table_name="replicas")
    op.drop_table("replicas")
    op.drop_table("blocks")
    op.drop_table("nodes")
