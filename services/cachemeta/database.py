"""The catalogue database's engine, and how values are stored in it."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

_I64 = 1 << 63
_U32_IS_NATIVE_LE = array("I").itemsize == 4 and sys.byteorder == "little"


def create_engine(db_url: str, *, echo: bool = False) -> AsyncEngine:
    """One engine for the process; dead pooled connections are replaced on checkout."""
    url = make_url(db_url)
    # hide_parameters: a failed statement's error (logged, and sent to the caller) must not
    # carry its parameters, which hold the token ids of prompts.
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


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    for pragma in ("journal_mode=WAL", "synchronous=NORMAL"):
        cursor.execute(f"PRAGMA {pragma}")
    cursor.close()


def pack_token_ids(token_ids: Sequence[int]) -> bytes:
    """Little-endian uint32s."""
    if _U32_IS_NATIVE_LE:
        return array("I", token_ids).tobytes()
    return b"".join(int(t).to_bytes(4, "little") for t in token_ids)  # pragma: no cover


def unpack_token_ids(data: bytes) -> list[int]:
    return [int.from_bytes(data[i : i + 4], "little") for i in range(0, len(data), 4)]


def to_signed64(value: int) -> int:
    return value - (1 << 64) if value >= _I64 else value


def from_signed64(value: int) -> int:
    return value + (1 << 64) if value < 0 else value
