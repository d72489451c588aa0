"""cachemeta fixtures: one event loop for every gRPC test (grpc.aio allows one per process), a
database per backend (a temp SQLite file, a fresh Postgres database per session) and served
catalogues on free ports."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from services.cachemeta.config import CacheMetaSettings
from services.cachemeta.main import CacheMetaService
from shared.rpc.client import CacheMetaClient
from tests.support.loop import BackgroundLoop, shared_loop
from tests.support.postgres import ADMIN_DSN as POSTGRES_ADMIN_DSN
from tests.support.postgres import terminate_sql

BACKENDS = ("sqlite", "postgres")


@pytest.fixture(scope="session")
def bg_loop() -> BackgroundLoop:
    return shared_loop()


class Postgres:
    """A fresh database on the test server, dropped at the end of the session. Owns it."""

    def __init__(self, loop: BackgroundLoop, admin_dsn: str) -> None:
        self.loop = loop
        self.admin_dsn = admin_dsn
        self.name = f"crescent_test_{secrets.token_hex(4)}"
        host_part = admin_dsn.rsplit("/", 1)[0].split("://", 1)[1]
        self.url = f"postgresql+asyncpg://{host_part}/{self.name}"

    def admin(self, *statements: str) -> list[Any]:
        async def run() -> list[Any]:
            conn = await asyncpg.connect(self.admin_dsn, timeout=5)
            try:
                return [await conn.fetch(s) for s in statements]
            finally:
                await conn.close()

        return self.loop.run(run())

    def create(self) -> None:
        self.admin(f'CREATE DATABASE "{self.name}"')

    def drop(self) -> None:
        self.admin(
            f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS true',
            self.terminate_sql(),
            f'DROP DATABASE IF EXISTS "{self.name}"',
        )

    def terminate_sql(self) -> str:
        return terminate_sql(self.name)

    def truncate(self) -> None:
        async def run() -> None:
            conn = await asyncpg.connect(f"postgresql://{self.url.split('://', 1)[1]}", timeout=5)
            try:
                await conn.execute(
                    "DO $$ BEGIN IF to_regclass('replicas') IS NOT NULL THEN "
                    "TRUNCATE replicas, blocks, nodes; END IF; "
                    "IF to_regclass('keeps') IS NOT NULL THEN TRUNCATE keeps; END IF; END $$"
                )
            finally:
                await conn.close()

        self.loop.run(run())


@pytest.fixture(scope="session")
def postgres(bg_loop: BackgroundLoop) -> Iterator[Postgres]:
    pg = Postgres(bg_loop, POSTGRES_ADMIN_DSN)
    try:
        pg.create()
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        pytest.skip(f"Postgres unreachable at {POSTGRES_ADMIN_DSN}: {exc!r}")
    yield pg
    pg.drop()


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty catalogue database of each backend."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'cachemeta.db'}"
    pg: Postgres = request.getfixturevalue("postgres")
    pg.truncate()
    return pg.url


@dataclass
class Served:
    """A ``CacheMetaService`` on the test loop with a client to it; ``restart`` builds a new
    service object on the same database and port. Owns both."""

    loop: BackgroundLoop
    settings: CacheMetaSettings
    service: CacheMetaService | None = None
    client: CacheMetaClient | None = None

    def start(self) -> Served:
        self.service = CacheMetaService(self.settings)
        self.loop.run(self.service.start())
        self.settings = self.settings.model_copy(update={"cachemeta_port": self.service.port})
        if self.client is None:
            self.client = CacheMetaClient(f"127.0.0.1:{self.service.port}", timeout_s=5.0)
        return self

    def stop(self) -> None:
        if self.service is not None:
            self.loop.run(self.service.stop())
            self.service = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        if self.client is not None:
            self.loop.run(self.client.close())

    def call(self, coro: Any, timeout_s: float = 30) -> Any:
        return self.loop.run(coro, timeout_s)


def count_sweeps(served: Served) -> list[int]:
    """A one-item counter of the sweeps ``served``'s sweeper completes from now on, so a test
    waits for one instead of sleeping past the sweep interval."""
    catalogue = served.service.catalogue if served.service is not None else None
    assert catalogue is not None, "start the service first"
    done, sweep = [0], catalogue.sweep

    async def counted() -> list[str]:
        swept = await sweep()
        done[0] += 1
        return swept

    catalogue.sweep = counted  # type: ignore[method-assign]
    return done


def settings_for(db_url: str, **overrides: Any) -> CacheMetaSettings:
    values: dict[str, Any] = {
        "db_url": db_url,
        "cachemeta_host": "127.0.0.1",
        "cachemeta_port": 0,
        "metrics_port": None,
        "replica_grace_s": 60.0,
    }
    return CacheMetaSettings(**(values | overrides))


@pytest.fixture
def served(bg_loop: BackgroundLoop, db_url: str) -> Iterator[Served]:
    s = Served(bg_loop, settings_for(db_url)).start()
    yield s
    s.close()
