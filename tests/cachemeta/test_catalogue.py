"""The catalogue core on a real database, without gRPC: clocked sweeps, cancelled callers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from services.cachemeta.catalogue import Catalogue
from services.cachemeta.database import create_engine
from services.cachemeta.migrations import upgrade
from services.cachemeta.repository import Repository
from shared.rpc.types import PrefixHolder
from tests.cachemeta.chains import chain, hashes
from tests.support.loop import BackgroundLoop

BLOCKS = chain(list(range(300, 340)))


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class SlowAfterCommit(Repository):
    """Its register commits, sets ``committed``, then returns only once ``released`` is set
    (an acknowledgement in flight for as long as the test needs)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.committed = asyncio.Event()
        self.released = asyncio.Event()

    async def register(self, *args: Any, **kwargs: Any) -> None:
        await super().register(*args, **kwargs)
        self.committed.set()
        await self.released.wait()


@asynccontextmanager
async def catalogue_on(
    db_url: str, clock: Clock, repository: type[Repository] = Repository
) -> AsyncIterator[Catalogue]:
    engine = create_engine(db_url)
    await upgrade(engine)
    catalogue = Catalogue(repository(engine), replica_grace_s=10, node_forget_s=100, clock=clock)
    await catalogue.load()
    try:
        yield catalogue
    finally:
        await catalogue.drain()
        await engine.dispose()


def run(bg_loop: BackgroundLoop, scenario: Callable[[], Awaitable[None]]) -> None:
    async def wrapped() -> None:
        await scenario()

    bg_loop.run(wrapped())


def test_sweep_then_forget_silent_nodes(bg_loop: BackgroundLoop, db_url: str) -> None:
    clock = Clock()

    async def scenario() -> None:
        async with catalogue_on(db_url, clock) as cat:
            for node in ("a", "b"):
                assert await cat.heartbeat(node, "decode", "e1", [])
                await cat.register(node, "dram", BLOCKS, replace_all=True)
            clock.now += 9
            await cat.heartbeat("b", "decode", "e1", [])
            assert await cat.sweep() == []
            clock.now += 2  # a: 11 s silent, b: 2 s
            assert await cat.sweep() == ["a"]
            assert await cat.sweep() == []  # nothing left to drop
            assert cat.match(hashes(BLOCKS)) == [PrefixHolder("b", "dram", 10)]
            clock.now += 95  # a: 106 s silent: forgotten
            await cat.heartbeat("b", "decode", "e1", [])
            assert await cat.sweep() == []
            assert [n.node_id for n in cat.list_nodes()] == ["b"]
            assert cat.stats().num_nodes == 1
            assert cat.stats() == await cat.repository.stats()
        # The database says the same after a reload.
        async with catalogue_on(db_url, clock) as cat:
            assert [n.node_id for n in cat.list_nodes()] == ["b"]
            assert cat.match(hashes(BLOCKS)) == [PrefixHolder("b", "dram", 10)]
            assert await cat.heartbeat("a", "decode", "e1", [])  # a stranger now: resync

    run(bg_loop, scenario)


def test_restarted_catalogue_gives_nodes_a_fresh_grace(
    bg_loop: BackgroundLoop, db_url: str
) -> None:
    clock = Clock()

    async def scenario() -> None:
        async with catalogue_on(db_url, clock) as cat:
            await cat.heartbeat("a", "prefill", "e1", [])
            await cat.register("a", "dram", BLOCKS, replace_all=True)
        clock.now += 60  # cachemeta was down for a minute; "a" could not heartbeat
        async with catalogue_on(db_url, clock) as cat:
            assert await cat.sweep() == []
            clock.now += 11
            assert await cat.sweep() == ["a"]

    run(bg_loop, scenario)


def test_cancelled_caller_does_not_leave_the_index_behind(
    bg_loop: BackgroundLoop, db_url: str
) -> None:
    clock = Clock()

    async def scenario() -> None:
        async with catalogue_on(db_url, clock, SlowAfterCommit) as cat:
            slow = cat.repository
            assert isinstance(slow, SlowAfterCommit)
            call = asyncio.ensure_future(cat.register("a", "dram", BLOCKS, replace_all=False))
            await asyncio.wait_for(slow.committed.wait(), 20)  # committed, not yet returned
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            slow.released.set()
            await cat.drain()
            assert cat.match(hashes(BLOCKS)) == [PrefixHolder("a", "dram", 10)]
        async with catalogue_on(db_url, clock) as cat:
            assert cat.match(hashes(BLOCKS)) == [PrefixHolder("a", "dram", 10)]

    run(bg_loop, scenario)
