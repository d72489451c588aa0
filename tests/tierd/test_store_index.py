"""What the stores share: the index's byte count, and per-block locks that exist only while
in use."""

from __future__ import annotations

import asyncio

from services.tierd.store_index import BlockIndex, KeyedLocks
from tests.tierd.blocks import make_block


def test_the_index_counts_each_block_once_at_its_stored_size() -> None:
    index = BlockIndex()
    (a, _), (b, _) = make_block(10), make_block(20, first_token=100)
    index.add(a, 110)
    index.add(b, 120)
    assert len(index) == 2 and index.used_bytes == 230
    index.add(a, 150)  # rewritten: its new size replaces the old one
    assert len(index) == 2 and index.used_bytes == 270 and index.size_of(a.block_hash) == 150
    headers = index.headers()
    assert headers == {a.block_hash: a, b.block_hash: b}
    headers.clear()  # a copy
    assert a.block_hash in index
    assert index.discard(a.block_hash) is True and index.discard(a.block_hash) is False
    assert index.used_bytes == 120 and index.size_of(a.block_hash) == 0
    index.clear()
    assert len(index) == 0 and index.used_bytes == 0 and b.block_hash not in index


def test_keyed_locks_serialise_one_key_and_vanish_when_free() -> None:
    async def scenario() -> None:
        locks = KeyedLocks()
        order: list[str] = []
        inside = asyncio.Event()

        async def hold(key: bytes, name: str, wait: asyncio.Event | None = None) -> None:
            async with locks.hold(key):
                order.append(f"{name} in")
                if wait is not None:
                    inside.set()
                    await wait.wait()
                order.append(f"{name} out")

        release = asyncio.Event()
        first = asyncio.create_task(hold(b"k", "first", release))
        await inside.wait()
        second = asyncio.create_task(hold(b"k", "second"))
        other = asyncio.create_task(hold(b"other", "other"))
        await other  # another key does not wait
        await asyncio.sleep(0)  # one loop turn (no time): the second task reaches the lock
        assert order == ["first in", "other in", "other out"]
        assert len(locks) == 1  # b"k", held and awaited; b"other" is gone
        release.set()
        await asyncio.gather(first, second)
        assert order[3:] == ["first out", "second in", "second out"]
        assert len(locks) == 0

        # A waiter cancelled before it gets the lock leaves no lock behind.
        gate = asyncio.Event()
        inside.clear()
        holder = asyncio.create_task(hold(b"k", "holder", gate))
        await inside.wait()
        waiter = asyncio.create_task(hold(b"k", "waiter"))
        await asyncio.sleep(0)  # one loop turn (no time): the waiter queues on the lock
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        gate.set()
        await holder
        assert len(locks) == 0 and "waiter in" not in order

    asyncio.run(scenario())
