"""Throwaway databases on the Postgres server the tests run against, and ways to cut a service
off from one. ``CRESCENT_TEST_POSTGRES_DSN`` names any database of a server that trusts us
(default: database ``test`` on 127.0.0.1:5432); the tests create their own beside it."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg

ADMIN_DSN = os.environ.get(
    "CRESCENT_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test"
)
SERVER = ADMIN_DSN.rsplit("/", 1)[0]


async def _admin(sql: str) -> None:
    conn = await asyncpg.connect(ADMIN_DSN, timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def reachable() -> bool:
    try:
        asyncio.run(_admin("SELECT 1"))
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return False
    return True


def sqlalchemy_url(name: str) -> str:
    return f"{SERVER.replace('postgresql://', 'postgresql+asyncpg://')}/{name}"


@contextmanager
def fresh_database(prefix: str = "crescent_test") -> Iterator[str]:
    """A new empty database, dropped (with whatever still connects to it) afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    try:
        yield name
    finally:
        asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def terminate_sql(name: str) -> str:
    """The statement that ends every open connection to ``name``."""
    return (
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
    )


def cut_off(name: str) -> None:
    """Refuses new connections to ``name`` and ends the open ones: an outage as its clients
    see it."""
    asyncio.run(_admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
    asyncio.run(_admin(terminate_sql(name)))


def restore(name: str) -> None:
    asyncio.run(_admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
