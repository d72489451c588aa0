"""The alembic migrations create exactly the tables the models describe, on both backends."""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, inspect

from services.cachemeta.database import create_engine
from services.cachemeta.migrations import upgrade
from services.cachemeta.models import Base
from tests.support.loop import BackgroundLoop


def test_migrations_match_the_models(bg_loop: BackgroundLoop, db_url: str) -> None:
    def diff(connection: Connection) -> list[Any]:
        return list(compare_metadata(MigrationContext.configure(connection), Base.metadata))

    def tables(connection: Connection) -> set[str]:
        return set(inspect(connection).get_table_names())

    async def scenario() -> tuple[list[Any], set[str]]:
        engine = create_engine(db_url)
        try:
            await upgrade(engine)
            await upgrade(engine)  # at head already: nothing to do, no error
            async with engine.connect() as conn:
                return await conn.run_sync(diff), await conn.run_sync(tables)
        finally:
            await engine.dispose()

    differences, names = bg_loop.run(scenario())
    assert differences == []
    assert names == {"alembic_version", "nodes", "blocks", "replicas", "keeps"}
