"""Keeping blocks in a pool: kept blocks survive any allocation pressure, hold one reference
each, end on their time, on release or when the ledger drops them, stay within the pool's
share, and go down to tierd before the pool's cold blocks do."""

from __future__ import annotations

import math

import pytest

from shared.engine.cache_exchange import CacheExchange
from shared.kv.keeps import PINNED, PoolKeeps
from shared.kv.pool import BlockPool, KVBlock


def h(i: int) -> bytes:
    return i.to_bytes(16, "big")


def cached_chain(pool: BlockPool, first: int, count: int) -> list[bytes]:
    """Caches ``count`` chained blocks and lets them go (cached, unreferenced)."""
    blocks = pool.allocate(count)
    assert blocks is not None
    hashes = [h(first + i) for i in range(count)]
    for i, (block, block_hash) in enumerate(zip(blocks, hashes, strict=True)):
        pool.cache_block(block, block_hash, hashes[i - 1] if i else h(0), [i])
    pool.free(blocks)
    return hashes


def churn(pool: BlockPool) -> None:
    """Takes every free block, as a burst of other requests would, and gives them back."""
    taken = pool.allocate(pool.num_free_blocks)
    assert taken is not None
    pool.free(taken)


def test_a_kept_chain_survives_a_pool_taken_whole_and_an_unkept_one_does_not() -> None:
    pool = BlockPool(16)
    keeps = PoolKeeps(pool)
    kept = cached_chain(pool, 100, 4)
    other = cached_chain(pool, 200, 4)
    assert keeps.keep(kept, PINNED, now=0.0) == 4
    assert [pool.get_cached_block(x).ref_cnt for x in kept] == [1, 1, 1, 1]  # type: ignore[union-attr]
    churn(pool)
    assert all(pool.get_cached_block(x) is not None for x in kept)
    assert all(pool.get_cached_block(x) is None for x in other)
    assert pool.num_free_blocks == 12  # the kept blocks are the only ones held


def test_keeping_again_takes_the_later_time_and_no_second_reference() -> None:
    pool = BlockPool(8)
    keeps = PoolKeeps(pool)
    chain = cached_chain(pool, 10, 2)
    assert keeps.keep(chain, until=50.0, now=0.0) == 2
    assert keeps.keep(chain, until=20.0, now=1.0) == 2
    assert keeps.until(chain[0]) == 50.0
    assert keeps.keep(chain, until=PINNED, now=2.0) == 2
    assert keeps.until(chain[1]) == math.inf
    assert pool.get_cached_block(chain[0]).ref_cnt == 1  # type: ignore[union-attr]
    assert keeps.keep(chain, until=5.0, now=5.0) == 0  # a time already past keeps nothing


def test_a_keep_stops_at_the_first_block_not_cached_and_at_the_pools_share() -> None:
    pool = BlockPool(8)
    keeps = PoolKeeps(pool, share=0.5)
    chain = cached_chain(pool, 10, 3)
    assert keeps.keep([chain[0], h(999), chain[2]], PINNED, now=0.0) == 1
    longer = cached_chain(pool, 20, 5)
    assert keeps.keep(longer, PINNED, now=0.0) == 3  # 4 of 8 blocks at most
    assert len(keeps) == keeps.max_kept == 4
    assert pool.get_cached_block(longer[3]).ref_cnt == 0  # type: ignore[union-attr]


def test_keeps_end_on_their_time_and_the_blocks_become_evictable() -> None:
    pool = BlockPool(8)
    keeps = PoolKeeps(pool)
    short, long = cached_chain(pool, 10, 2), cached_chain(pool, 20, 2)
    keeps.keep(short, until=10.0, now=0.0)
    keeps.keep(long, until=100.0, now=0.0)
    assert keeps.expire(9.0) == []
    assert keeps.expire(10.0) == short
    assert short[0] not in keeps and long[0] in keeps
    assert pool.get_cached_block(short[0]).ref_cnt == 0  # type: ignore[union-attr]
    churn(pool)
    assert pool.get_cached_block(short[0]) is None
    assert pool.get_cached_block(long[0]) is not None


def test_release_lets_the_chain_go_tail_first() -> None:
    pool = BlockPool(8)
    keeps = PoolKeeps(pool)
    chain = cached_chain(pool, 10, 3)
    keeps.keep(chain, PINNED, now=0.0)
    assert keeps.release([*chain, h(999)]) == 3
    assert keeps.release(chain) == 0
    queue = [b.block_hash for b in pool.free_queue if b.block_hash in chain]
    assert queue == list(reversed(chain))  # the tail is evicted first


def test_following_the_ledger_drops_what_it_dropped_and_spares_fresh_keeps() -> None:
    pool = BlockPool(16)
    keeps = PoolKeeps(pool)
    dropped, extended, fresh = (cached_chain(pool, i * 10, 2) for i in (1, 2, 3))
    keeps.keep(dropped, until=50.0, now=0.0)
    keeps.keep(extended, until=50.0, now=0.0)
    keeps.keep(fresh, until=50.0, now=5.0)
    ledger = {extended[0]: 80.0, extended[1]: PINNED}  # read at t=4, before `fresh` was kept
    assert keeps.follow(ledger, asked_at=4.0, now=6.0) == 2
    assert dropped[0] not in keeps and fresh[0] in keeps
    assert (keeps.until(extended[0]), keeps.until(extended[1])) == (80.0, math.inf)


def test_the_share_must_be_a_fraction() -> None:
    with pytest.raises(ValueError):
        PoolKeeps(BlockPool(4), share=1.5)


def test_a_sink_offers_kept_blocks_before_the_pools_cold_ones() -> None:
    pool = BlockPool(16)
    keeps = PoolKeeps(pool)
    cold = cached_chain(pool, 10, 4)
    kept = cached_chain(pool, 20, 3)
    keeps.keep(kept, PINNED, now=0.0)
    exchange = CacheExchange(pool, 4, lambda salt: h(0), lambda block_id: 7, keeps)
    offered = exchange.offer_sink(4, lambda block_hash: False)
    # Every kept block, then the coldest (a chain's tail first) up to the four asked for.
    assert [b.block_hash for b in offered] == [*kept, cold[-1]]
    assert all(pool.get_cached_block(x).ref_cnt == 2 for x in kept)  # type: ignore[union-attr]
    exchange.unpin([b.block_id for b in offered])
    pool.mark_sunk(kept)
    again = exchange.offer_sink(4, lambda block_hash: False)
    assert kept[0] not in {b.block_hash for b in again}


def test_blocks_reach_the_keeps_only_through_the_pools_references() -> None:
    pool = BlockPool(4)
    keeps = PoolKeeps(pool)
    chain = cached_chain(pool, 10, 1)
    held = pool.get_cached_block(chain[0])
    assert isinstance(held, KVBlock)
    pool.touch([held])  # a running sequence holds it too
    keeps.keep(chain, PINNED, now=0.0)
    pool.free([held])
    assert held.ref_cnt == 1 and held not in pool.free_queue
    keeps.release(chain)
    assert held.ref_cnt == 0 and held in pool.free_queue
