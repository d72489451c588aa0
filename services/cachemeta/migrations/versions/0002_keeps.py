"""Keeps: blocks a tenant asked to keep, pinned or until a time.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "keeps",
        sa.Column("hash", sa.LargeBinary(16), primary_key=True),
        sa.Column("quota_key", sa.LargeBinary(64), nullable=False),
        sa.Column("until", sa.Float, nullable=False),
        sa.Column("pinned", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.create_index("ix_keeps_quota_key", "keeps", ["quota_key"])


def downgrade() -> None:
    op.drop_index("ix_keeps_quota_key", table_name="keeps")
    op.drop_table("keeps")
