"""Belady's MIN: exact hits on the hand-checked trace, equal to an exhaustive search on tiny
traces, and never below any of tierd's policies on random ones."""

from __future__ import annotations

import functools
import itertools
import random

import pytest

from crescent.sim.belady import NEVER, OptimalPool, next_uses, optimal_hit_rate
from crescent.sim.pool import BlockPool
from services.tierd.policy import POLICIES
from tests.unit.sim_traces import HAND_BELADY_HITS, HAND_CAPACITY, HAND_TRACE, random_trace


def test_next_uses_point_at_the_next_request_asking() -> None:
    assert next_uses(HAND_TRACE) == [
        [1, 2, 4],
        [2, 3],
        [3, 4, NEVER],
        [4, NEVER],
        [NEVER, NEVER, NEVER],
    ]


def test_belady_hits_on_the_hand_checked_trace() -> None:
    pool = OptimalPool(HAND_TRACE, HAND_CAPACITY)
    assert [pool.access(ids) for ids in HAND_TRACE] == HAND_BELADY_HITS
    assert (pool.hits, pool.requested) == (7, 13)
    assert len(pool) == HAND_CAPACITY and 1 in pool


def _exhaustive_best(trace: list[list[int]], capacity: int) -> int:
    """The most leading hits any choice of what to keep after each request can give."""

    @functools.cache
    def best(position: int, held: frozenset[int]) -> int:
        if position == len(trace):
            return 0
        ids = trace[position]
        hits = next((i for i, h in enumerate(ids) if h not in held), len(ids))
        pool = held | set(ids)
        keep = min(capacity, len(pool))
        return hits + max(
            best(position + 1, frozenset(kept))
            for kept in itertools.combinations(sorted(pool), keep)
        )

    return best(0, frozenset())


def test_belady_is_the_optimum_on_tiny_traces() -> None:
    rng = random.Random(5)
    for _ in range(30):
        trace = random_trace(rng, rng.randrange(3, 8), fresh_ids=3)
        capacity = rng.randrange(1, 4)
        pool = OptimalPool(trace, capacity)
        for ids in trace:
            pool.access(ids)
        assert pool.hits == _exhaustive_best(trace, capacity)


@pytest.mark.parametrize("seed", range(6))
def test_belady_bounds_every_policy(seed: int) -> None:
    rng = random.Random(seed)
    trace = random_trace(rng, 300)
    for capacity in (2, 8, 30, None):
        optimum = optimal_hit_rate(trace, capacity)
        for name in sorted(POLICIES):
            pool = BlockPool(capacity, name)
            for t, ids in enumerate(trace):
                pool.access(ids, float(t))
            assert pool.hit_rate <= optimum + 1e-12, (name, capacity)
        if capacity is None:
            assert optimum == pytest.approx(pool.hit_rate)  # unlimited: every repeat is a hit


def test_ties_toward_the_shallower_block_lose_hits() -> None:
    # One block of room, a request for 1-2 twice: 1 and 2 are next needed by the same request.
    # Keeping the parent finds 1 again; keeping the child finds nothing (the prefix stops at 1).
    trace = [[1, 2], [1, 2]]
    deeper = OptimalPool(trace, 1)
    shallower = OptimalPool(trace, 1, deeper_first=False)
    for ids in trace:
        deeper.access(ids)
        shallower.access(ids)
    assert (deeper.hits, shallower.hits) == (1, 0)


def test_requests_must_come_in_the_order_given() -> None:
    pool = OptimalPool(HAND_TRACE, 2)
    pool.access(HAND_TRACE[0])
    with pytest.raises(ValueError, match="request 1"):
        pool.access(HAND_TRACE[2])
    with pytest.raises(ValueError, match="capacity"):
        OptimalPool(HAND_TRACE, -1)
