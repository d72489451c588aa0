"""The catalogue's schema migrations (alembic), run at start by ``upgrade``.

From a shell: ``alembic -c services/cachemeta/alembic.ini upgrade head`` with ``CRESCENT_DB_URL``.
"""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

MIGRATIONS_DIR = Path(__file__).resolve().parent
# alembic >= 1.17 logs each of its plugins at INFO on every run.
logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)


def alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        # env.py runs the migrations on this connection instead of opening its own.
        config.attributes["connection"] = connection
    return config


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    """Brings the schema to ``revision`` inside the running loop, on one of the engine's
    connections (alembic itself is synchronous: it runs through ``run_sync``)."""

    def run(connection: Connection) -> None:
        command.upgrade(alembic_config(connection), revision)

    async with engine.begin() as conn:
        await conn.run_sync(run)
