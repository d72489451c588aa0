"""The simulator's block pool: exact hits on a hand-checked trace, its invariants on random
ones, and agreement with a plain LRU replay where prefixes never compete."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from crescent.sim.pool import BlockPool
from services.tierd.policy import POLICIES, make_policy
from tests.unit.sim_traces import HAND_CAPACITY, HAND_LRU_HITS, HAND_TRACE, random_trace


def test_lru_hits_on_the_hand_checked_trace() -> None:
    pool = BlockPool(HAND_CAPACITY, make_policy("lru"))
    hits = [pool.access(ids, now=float(t)) for t, ids in enumerate(HAND_TRACE)]
    assert hits == HAND_LRU_HITS
    assert (pool.hits, pool.requested) == (6, 13)
    assert pool.hit_rate == pytest.approx(6 / 13)
    assert sorted(h for h in range(10) if h in pool) == [1, 2, 3]
    assert pool.evictions == 4 and len(pool) == 3


def test_a_request_s_blocks_each_get_their_own_time() -> None:
    # All at the same timestamp: recency still follows the order of access, so the first
    # request's leaf (2) goes, not the second's (4).
    pool = BlockPool(3, "lru")
    pool.access([1, 2], now=5.0)
    pool.access([3, 4], now=5.0)
    assert [h in pool for h in (1, 2, 3, 4)] == [True, False, True, True]


def _plain_lru_hits(trace: list[list[int]], capacity: int) -> int:
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for ids in trace:
        for hash_id in ids:
            if hash_id not in cache:
                break
            hits += 1
        for hash_id in ids:
            cache[hash_id] = None
            cache.move_to_end(hash_id)
            if len(cache) > capacity:
                cache.popitem(last=False)
    return hits


def test_lru_is_plain_lru_on_chains_that_never_share() -> None:
    # One-block requests: no prefixes, so prefix-aware LRU is the textbook one.
    rng = random.Random(3)
    trace = [[rng.randrange(40)] for _ in range(2_000)]
    for capacity in (1, 5, 20):
        pool = BlockPool(capacity, "lru")
        for t, ids in enumerate(trace):
            pool.access(ids, float(t))
        assert pool.hits == _plain_lru_hits(trace, capacity)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_invariants_hold_on_random_traces(name: str) -> None:
    rng = random.Random(name)
    for _ in range(10):
        trace = random_trace(rng, 120)
        capacity = rng.randrange(1, 30)
        pool = BlockPool(capacity, make_policy(name))
        parents = {ids[i]: ids[i - 1] for ids in trace for i in range(1, len(ids))}
        requested = 0
        seen: set[int] = set()
        for t, ids in enumerate(trace):
            before = pool.lookup(ids)
            assert pool.lookup(ids) == before  # lookup changes nothing
            assert pool.access(ids, float(t)) == before
            requested += len(ids)
            seen.update(ids)
            held = [h for h in seen if h in pool]
            assert len(pool) <= capacity
            assert all(parents[h] in pool for h in held if h in parents)
        assert pool.requested == requested and 0 <= pool.hits <= requested


def test_a_learning_policy_s_order_stays_its_own_after_it_relearns() -> None:
    # crescent refreshes what it learned (rank_version) as blocks come and go; the pool's
    # next victim is still the one the policy picks from scratch.
    rng = random.Random(11)
    trace = random_trace(rng, 1_500)
    pool = BlockPool(40, "crescent")
    checked = 0
    for t, ids in enumerate(trace):
        pool.access(ids, float(t))
        if t % 25 == 0:
            expected = pool.policy.victims(dict(pool.infos), 1, now=float(t))
            assert pool.next_victim() == int.from_bytes(expected[0], "big")
            checked += 1
    assert getattr(pool.policy, "rank_version", 0) >= 2 and checked == 60


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_pool_that_defers_its_index_until_it_fills_serves_as_one_that_does_not(
    name: str,
) -> None:
    rng = random.Random(f"defer-{name}")
    for capacity in (0, 1, 7, 40, 150, None):
        trace = random_trace(rng, 300)
        deferred, direct = BlockPool(capacity, name), BlockPool(capacity, name, defer=False)
        for t, ids in enumerate(trace):
            now = float(t // 3)  # equal times too: the blocks' own ticks order them
            assert deferred.access(ids, now) == direct.access(ids, now)
            assert len(deferred) == len(direct) and deferred.evictions == direct.evictions
            assert all((h in deferred) == (h in direct) for h in ids)
            if rng.random() < 0.01:  # reading the order replays the log early
                assert deferred.next_victim() == direct.next_victim()
        assert (deferred.hits, deferred.requested) == (direct.hits, direct.requested)
        assert _as_tuples(deferred) == _as_tuples(direct)
        assert deferred.next_victim() == direct.next_victim()


def _as_tuples(pool: BlockPool) -> dict[bytes, tuple[object, ...]]:
    return {
        key: (i.parent_hash, i.depth, i.created_at, i.last_access, i.access_count)
        for key, i in pool.infos.items()
    }


def test_without_a_capacity_nothing_is_evicted() -> None:
    rng = random.Random(9)
    trace = random_trace(rng, 200)
    pool = BlockPool(None, "crescent")
    for t, ids in enumerate(trace):
        pool.access(ids, float(t))
    distinct = {h for ids in trace for h in ids}
    assert len(pool) == len(distinct) and pool.evictions == 0
    # Every repeat of a block is a hit: the cold misses are the first sightings.
    assert pool.requested - pool.hits == len(distinct)


def _lfu_alternation(history_blocks: int) -> BlockPool:
    # LFU in one block: 5 and 6 take turns, then a new 7 arrives. With a history, each return
    # adds to the count the block had when it went (5 ends at 2 reads, 6 at 1), so the new 7
    # (no reads) is the one to go; without, every block comes back new, and 5, older, goes.
    pool = BlockPool(1, "lfu", history_blocks=history_blocks)
    for t, hash_id in enumerate([5, 6, 5, 6, 5, 7]):
        pool.access([hash_id], float(t))
    return pool


def test_an_evicted_block_that_returns_keeps_its_count() -> None:
    assert [h in _lfu_alternation(10) for h in (5, 6, 7)] == [True, False, False]
    assert [h in _lfu_alternation(0) for h in (5, 6, 7)] == [False, False, True]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="capacity"):
        BlockPool(-1, "lru")
    with pytest.raises(ValueError, match="block_bytes"):
        BlockPool(10, "lru", block_bytes=0)
    with pytest.raises(ValueError, match="unknown eviction policy"):
        BlockPool(10, "fifo")
    pool = BlockPool(10, "lru", block_bytes=4096)
    pool.access([1, 2, 3], 0.0)
    assert pool.held_bytes == 3 * 4096 and "1" not in pool
