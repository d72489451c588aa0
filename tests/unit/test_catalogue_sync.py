"""A node's catalogue sync as a lifecycle tick: an outage of cachemeta is logged once and ends
in a full resync; any other failure also forces a resync and is raised for the lifecycle."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from shared.node.catalogue import CatalogueSync
from shared.rpc.client import CacheMetaUnavailable


class Client:
    """cachemeta as the sync sees it: fails with ``error`` while it is set."""

    def __init__(self) -> None:
        self.error: Exception | None = None
        self.replaced = 0

    async def heartbeat(self, *args: Any) -> bool:
        if self.error is not None:
            raise self.error
        return False

    async def register_blocks(self, *args: Any, replace: bool = False) -> None:
        self.replaced += replace

    async def drop_blocks(self, *args: Any) -> None:
        return None


class Host:
    """The engine host's side of a sync: an empty pool of eight blocks."""

    engine = SimpleNamespace(
        pool=SimpleNamespace(num_blocks=8, num_free_blocks=8, num_cached_blocks=0)
    )

    def pool_usage(self) -> tuple[int, int]:
        return 8, 0

    async def snapshot(self) -> list[Any]:
        return []

    async def drain_events(self) -> tuple[list[Any], list[Any]]:
        return [], []


def test_an_outage_is_logged_once_and_ends_in_a_resync(caplog: pytest.LogCaptureFixture) -> None:
    client = Client()
    sync = CatalogueSync(client, Host(), "n1", "decode", 64, heartbeat_interval_s=0.0)  # type: ignore[arg-type]

    async def scenario() -> None:
        await sync.tick()
        assert sync.in_step and client.replaced == 1
        client.error = CacheMetaUnavailable("away")
        with caplog.at_level(logging.WARNING, logger="shared.node.catalogue"):
            await sync.tick()
            await sync.tick()
        assert not sync.in_step
        client.error = None
        await sync.tick()
        assert sync.in_step and client.replaced == 2

    asyncio.run(scenario())
    assert len([r for r in caplog.records if "sync failed" in r.getMessage()]) == 1


def test_an_unexpected_failure_forces_a_resync_and_is_raised() -> None:
    client = Client()
    sync = CatalogueSync(client, Host(), "n1", "decode", 64, heartbeat_interval_s=0.0)  # type: ignore[arg-type]

    async def scenario() -> None:
        await sync.tick()
        client.error = ValueError("bad reply")
        with pytest.raises(ValueError):
            await sync.tick()
        assert not sync.in_step

    asyncio.run(scenario())
