"""alembic environment: migrations on a connection handed over by ``upgrade`` (the service), or
on a fresh async engine from ``CRESCENT_DB_URL`` / ``sqlalchemy.url`` (the alembic command)."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from services.cachemeta.config import MigrationSettings
from services.cachemeta.models import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = MigrationSettings().db_url or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("set CRESCENT_DB_URL (or sqlalchemy.url) to migrate the catalogue")
    return url


def _migrate(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


async def _migrate_with_own_engine(url: str) -> None:
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_migrate)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
elif (connection := config.attributes.get("connection")) is not None:
    _migrate(connection)
else:
    asyncio.run(_migrate_with_own_engine(_url()))
