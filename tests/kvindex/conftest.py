"""kvindex fixtures: a real NATS server for the module, a running index with an HTTP client
to its prefix queries, and cachemeta's (the test loop gRPC needs, a Postgres database)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.kvindex.config import KvIndexSettings
from services.kvindex.main import KvIndexService
from tests.cachemeta.conftest import bg_loop, postgres
from tests.support.nats import nats_url as running_nats

__all__ = ["bg_loop", "postgres"]


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_nats(Path(tmp_path_factory.mktemp("nats"))) as url:
        yield url


@contextlib.asynccontextmanager
async def running_index(
    nats_url: str, **overrides: Any
) -> AsyncIterator[tuple[KvIndexService, httpx.AsyncClient]]:
    """A started kvindex on a free port, and a client of its HTTP port; both closed after."""
    values: dict[str, Any] = {"nats_url": nats_url, "kvindex_port": 0, "dev_mode": True}
    service = KvIndexService(KvIndexSettings(**(values | overrides)))
    await service.start()
    try:
        base = f"http://127.0.0.1:{service.port}"
        async with httpx.AsyncClient(base_url=base, timeout=10.0) as client:
            yield service, client
    finally:
        await service.stop()
