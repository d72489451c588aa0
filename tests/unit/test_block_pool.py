"""Reference counting, free-queue order and prefix-cache eviction of the block pool."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from shared.kv.pool import BlockPool, FreeBlockQueue, KVBlock


def h(i: int) -> bytes:
    return i.to_bytes(16, "big")


def ids(blocks: object) -> list[int]:
    return [b.block_id for b in blocks]  # type: ignore[attr-defined]


def queue_ids(pool: BlockPool) -> list[int]:
    return ids(pool.free_queue)


def allocate(pool: BlockPool, num: int) -> list[KVBlock]:
    blocks = pool.allocate(num)
    assert blocks is not None
    return blocks


# --- FreeBlockQueue ---------------------------------------------------------------------


def test_free_queue_operations() -> None:
    blocks = [KVBlock(i) for i in range(5)]
    q = FreeBlockQueue(blocks)
    assert len(q) == 5 and ids(q) == [0, 1, 2, 3, 4]
    q.remove(blocks[2])
    assert ids(q) == [0, 1, 3, 4] and blocks[2] not in q
    assert q.popleft() is blocks[0]
    q.append(blocks[0])
    q.append(blocks[2])
    assert ids(q) == [1, 3, 4, 0, 2] and len(q) == 5
    with pytest.raises(ValueError):
        q.append(blocks[3])
    for _ in range(5):
        q.popleft()
    assert len(q) == 0 and ids(q) == []
    with pytest.raises(IndexError):
        q.popleft()
    with pytest.raises(ValueError):
        q.remove(blocks[1])


# --- allocation and freeing -------------------------------------------------------------


def test_construction() -> None:
    pool = BlockPool(4)
    assert pool.num_blocks == 4
    assert ids(pool.blocks) == [0, 1, 2, 3]
    assert queue_ids(pool) == [0, 1, 2, 3]
    assert pool.num_free_blocks == 4 and pool.num_cached_blocks == 0 and pool.usage == 0.0
    for bad in (0, -3):
        with pytest.raises(ValueError):
            BlockPool(bad)


def test_allocation_order_and_ref_counts() -> None:
    pool = BlockPool(5)
    first = allocate(pool, 3)
    assert ids(first) == [0, 1, 2]
    assert [b.ref_cnt for b in first] == [1, 1, 1]
    assert queue_ids(pool) == [3, 4]
    assert pool.num_free_blocks == 2
    assert pool.usage == pytest.approx(0.6)
    assert ids(allocate(pool, 2)) == [3, 4]
    assert pool.num_free_blocks == 0 and pool.usage == 1.0
    assert pool.allocate(0) == []
    with pytest.raises(ValueError):
        pool.allocate(-1)


def test_allocating_more_than_free_changes_nothing() -> None:
    pool = BlockPool(4)
    held = allocate(pool, 2)
    pool.cache_block(held[0], h(1))
    pool.free([held[0]])
    pool.drain_events()
    before = [(b.block_id, b.ref_cnt, b.block_hash) for b in pool.blocks]

    assert pool.allocate(4) is None

    assert [(b.block_id, b.ref_cnt, b.block_hash) for b in pool.blocks] == before
    assert queue_ids(pool) == [2, 3, 0]
    assert pool.get_cached_block(h(1)) is held[0]
    assert pool.drain_events() == ([], [])


def test_free_appends_in_reverse_order() -> None:
    pool = BlockPool(6)
    blocks = allocate(pool, 4)
    pool.free(blocks[:3])
    assert [b.ref_cnt for b in pool.blocks] == [0, 0, 0, 1, 0, 0]
    assert queue_ids(pool) == [4, 5, 2, 1, 0]
    pool.free(blocks[3:])
    assert queue_ids(pool) == [4, 5, 2, 1, 0, 3]
    # The next allocation takes never-used slots first, then the deepest freed block.
    assert ids(allocate(pool, 3)) == [4, 5, 2]


def test_shared_block_stays_out_of_queue_until_last_reference() -> None:
    pool = BlockPool(3)
    a, b = allocate(pool, 2)
    pool.touch([a])
    assert a.ref_cnt == 2
    pool.free([a, b])
    assert (a.ref_cnt, b.ref_cnt) == (1, 0)
    assert queue_ids(pool) == [2, 1]
    pool.free([a])
    assert queue_ids(pool) == [2, 1, 0]


def test_free_of_unreferenced_block_raises_and_changes_nothing() -> None:
    pool = BlockPool(3)
    a, b = allocate(pool, 2)
    pool.free([b])
    with pytest.raises(ValueError):
        pool.free([b])
    # Freeing `a` twice in one call over-releases it: nothing must change.
    with pytest.raises(ValueError):
        pool.free([a, a])
    assert (a.ref_cnt, b.ref_cnt) == (1, 0)
    assert queue_ids(pool) == [2, 1]


def test_block_listed_twice_is_queued_once() -> None:
    pool = BlockPool(2)
    (a,) = allocate(pool, 1)
    pool.touch([a])
    pool.free([a, a])
    assert a.ref_cnt == 0
    assert queue_ids(pool) == [1, 0]


# --- prefix cache -----------------------------------------------------------------------


def test_lru_eviction_order() -> None:
    pool = BlockPool(6)
    seq_a = allocate(pool, 3)  # ids 0, 1, 2
    seq_b = allocate(pool, 2)  # ids 3, 4
    for i, block in enumerate(seq_a):
        assert pool.cache_block(block, h(10 + i))
    for i, block in enumerate(seq_b):
        assert pool.cache_block(block, h(20 + i))
    assert pool.num_cached_blocks == 5
    assert pool.drain_events() == ([h(10), h(11), h(12), h(20), h(21)], [])

    pool.free(seq_a)
    pool.free(seq_b)
    assert queue_ids(pool) == [5, 2, 1, 0, 4, 3]
    # Cached-but-unreferenced blocks still count as free.
    assert pool.num_free_blocks == 6 and pool.num_cached_blocks == 5

    assert ids(allocate(pool, 3)) == [5, 2, 1]
    assert pool.drain_events() == ([], [h(12), h(11)])
    assert pool.get_cached_block(h(12)) is None
    assert pool.get_cached_block(h(11)) is None
    assert pool.get_cached_block(h(10)) is seq_a[0]
    assert seq_a[1].block_hash is None and seq_a[2].block_hash is None

    assert ids(allocate(pool, 2)) == [0, 4]
    assert pool.drain_events() == ([], [h(10), h(21)])
    assert pool.get_cached_block(h(20)) is seq_b[0]
    assert pool.num_cached_blocks == 1


def test_touch_claims_cached_free_block() -> None:
    pool = BlockPool(4)
    seq = allocate(pool, 2)
    pool.cache_block(seq[0], h(1))
    pool.cache_block(seq[1], h(2))
    pool.free(seq)
    assert queue_ids(pool) == [2, 3, 1, 0]
    pool.drain_events()

    hit = pool.get_cached_block(h(1))
    assert hit is seq[0] and hit.ref_cnt == 0
    pool.touch([hit])
    assert hit.ref_cnt == 1
    assert queue_ids(pool) == [2, 3, 1]
    assert pool.num_free_blocks == 3

    assert ids(allocate(pool, 3)) == [2, 3, 1]
    assert pool.drain_events() == ([], [h(2)])
    assert pool.get_cached_block(h(1)) is hit and hit.block_hash == h(1)
    assert pool.allocate(1) is None


def test_duplicate_hash_is_refused() -> None:
    pool = BlockPool(3)
    a, b = allocate(pool, 2)
    assert pool.cache_block(a, h(7)) is True
    assert pool.cache_block(b, h(7)) is False
    assert b.block_hash is None
    assert pool.get_cached_block(h(7)) is a
    # Re-caching under the same hash is a no-op that succeeds.
    assert pool.cache_block(a, h(7)) is True
    assert pool.drain_events() == ([h(7)], [])
    assert pool.num_cached_blocks == 1
    with pytest.raises(ValueError):
        pool.cache_block(a, h(8))
    with pytest.raises(ValueError):
        pool.cache_block(b, b"short")


def test_events_net_out_within_one_drain() -> None:
    pool = BlockPool(1)
    (a,) = allocate(pool, 1)
    pool.cache_block(a, h(1))
    pool.free([a])
    (a,) = allocate(pool, 1)  # evicts h(1) before anyone drained its store
    pool.cache_block(a, h(2))
    assert pool.drain_events() == ([h(2)], [h(1)])
    assert pool.drain_events() == ([], [])


def test_reset_prefix_cache_keeps_referenced_blocks() -> None:
    pool = BlockPool(4)
    blocks = allocate(pool, 3)
    for i, block in enumerate(blocks):
        pool.cache_block(block, h(i))
    pool.free(blocks[1:])
    pool.drain_events()

    assert pool.reset_prefix_cache() == 2
    assert pool.drain_events() == ([], [h(2), h(1)])
    assert pool.get_cached_block(h(0)) is blocks[0]
    assert pool.get_cached_block(h(1)) is None and pool.get_cached_block(h(2)) is None
    assert pool.num_cached_blocks == 1
    assert queue_ids(pool) == [3, 2, 1]
    assert pool.reset_prefix_cache() == 0


# --- randomized invariants --------------------------------------------------------------


def check_invariants(pool: BlockPool, refs: Counter[int], catalogue: set[bytes]) -> None:
    queued = ids(pool.free_queue)
    assert len(queued) == len(set(queued)) == pool.num_free_blocks
    for block in pool.blocks:
        assert block.ref_cnt == refs[block.block_id] >= 0
        assert (block.block_id in queued) == (block.ref_cnt == 0)
        assert (block in pool.free_queue) == (block.ref_cnt == 0)
        if block.block_hash is not None:
            assert pool.get_cached_block(block.block_hash) is block
    hashed = [b.block_hash for b in pool.blocks if b.block_hash is not None]
    # Every map entry is some block's own hash, so the map is a bijection onto hashed blocks.
    assert len(hashed) == len(set(hashed)) == pool.num_cached_blocks
    unsunk = [b for b in pool.blocks if b.block_hash is not None and not b.sunk]
    assert pool.num_unsunk == len(unsunk)
    assert all(not b.sunk and not b.quota_key for b in pool.blocks if b.block_hash is None)
    assert pool.usage == pytest.approx(1 - pool.num_free_blocks / pool.num_blocks)

    stored, evicted = pool.drain_events()
    assert not set(stored) & set(evicted)
    catalogue.difference_update(evicted)
    catalogue.update(stored)
    assert catalogue == set(hashed)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_randomized_invariants(seed: int) -> None:
    rng = random.Random(seed)
    pool = BlockPool(16)
    refs: Counter[int] = Counter()
    catalogue: set[bytes] = set()
    sequences: list[list[KVBlock]] = []

    for _ in range(2000):
        op = rng.random()
        if op < 0.3:
            got = pool.allocate(rng.randint(0, 6))
            if got is None:
                assert pool.num_free_blocks < 6
            elif got:
                refs.update(b.block_id for b in got)
                sequences.append(got)
        elif op < 0.55 and sequences:
            seq = sequences.pop(rng.randrange(len(sequences)))
            pool.free(seq)
            refs.subtract(b.block_id for b in seq)
        elif op < 0.75 and sequences:
            seq = rng.choice(sequences)
            block = rng.choice(seq)
            if block.block_hash is None:
                # A small hash space makes duplicate-hash refusals frequent.
                key, sunk = bytes([rng.randrange(3)]), rng.random() < 0.3
                cached = pool.cache_block(block, h(rng.randrange(12)), None, (), key, sunk=sunk)
                assert cached == (block.block_hash is not None)
        elif op < 0.8:
            pool.mark_sunk([h(rng.randrange(12)) for _ in range(3)])
        elif op < 0.95:
            hit = pool.get_cached_block(h(rng.randrange(12)))
            if hit is not None:
                pool.touch([hit])
                refs[hit.block_id] += 1
                sequences.append([hit])
        elif op < 0.97:
            pool.forget_sunk()
        else:
            pool.reset_prefix_cache()
        check_invariants(pool, refs, catalogue)

    for seq in sequences:
        pool.free(seq)
        refs.subtract(b.block_id for b in seq)
    check_invariants(pool, refs, catalogue)
    assert pool.num_free_blocks == 16 and pool.usage == 0.0


def test_sunk_marks_and_quota_keys_live_and_die_with_the_hash() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(3)
    assert blocks is not None
    pool.cache_block(blocks[0], h(0), None, (), b"tenant-a")
    pool.cache_block(blocks[1], h(1), None, (), b"tenant-b", sunk=True)
    pool.cache_block(blocks[2], h(2))
    assert pool.num_unsunk == 2
    assert pool.mark_sunk([h(0), h(1), h(9)]) == 1  # h(1) already, h(9) unknown
    assert pool.num_unsunk == 1 and blocks[0].sunk and blocks[0].quota_key == b"tenant-a"
    pool.free(blocks)
    pool.forget_sunk()  # the lower tier was lost: everything is to be written again
    assert pool.num_unsunk == 3 and not any(b.sunk for b in blocks)
    pool.mark_sunk([h(2)])
    evicted = pool.allocate(4)  # evicts all three cached blocks
    assert evicted is not None and pool.num_unsunk == 0
    assert all(not b.sunk and b.quota_key == b"" for b in evicted)
