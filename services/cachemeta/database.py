"""The catalogue database's engine, and how values are stored in it."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

_I64 = 1 << 63
#: The catalogue names every cached block: only cachemeta's user may read its file.
FILE_MODE = 0o600


def create_engine(db_url: str, *, echo: bool = False) -> AsyncEngine:
    """One engine for the process; dead pooled connections are replaced on checkout."""
    url = make_url(db_url)
    if url.get_backend_name() == "sqlite":
        make_private(url.database)
    # hide_parameters: a failed statement's error (logged, and sent to the caller) must not
    # carry its parameters, which name tenants' blocks.
    kwargs: dict[str, Any] = {"pool_pre_ping": True, "echo": echo, "hide_parameters": True}
    if url.get_backend_name() == "sqlite":
        kwargs["connect_args"] = {"timeout": 30}
    elif url.get_driver_name() == "asyncpg":
        kwargs["connect_args"] = {"timeout": 5, "command_timeout": 60}
        kwargs["pool_size"] = 4
        kwargs["max_overflow"] = 4
    engine = create_async_engine(url, **kwargs)
    if url.get_backend_name() == "sqlite":
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
    return engine


def make_private(database: str | None) -> None:
    """Creates the SQLite file ``database`` readable by its owner alone, or narrows an existing
    one (and its -wal and -shm, which SQLite creates with the main file's mode) to that."""
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE))
    for file in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        with contextlib.suppress(FileNotFoundError):
            file.chmod(FILE_MODE)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # secure_delete: a deleted row's bytes are zeroed in the file, not left in free pages.
    for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "secure_delete=ON"):
        cursor.execute(f"PRAGMA {pragma}")
    cursor.close()


def to_signed64(value: int) -> int:
    return value - (1 << 64) if value >= _I64 else value


def from_signed64(value: int) -> int:
    return value + (1 << 64) if value < 0 else value
