"""Blocks without their token ids: the catalogue keys blocks by hash and never read them back,
yet the database held every cached prompt and completion in clear.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        # SQLite rebuilds the table to drop a column; secure_delete zeroes the freed pages
        # that held the ids, rather than leaving them readable in the file.
        op.execute("PRAGMA secure_delete=ON")
    with op.batch_alter_table("blocks") as batch:
        batch.drop_column("token_ids")


def downgrade() -> None:
    # The ids are gone: old code reading them finds empty blocks' worth of none.
    with op.batch_alter_table("blocks") as batch:
        batch.add_column(
            sa.Column("token_ids", sa.LargeBinary, nullable=False, server_default=sa.text("x''"))
        )
