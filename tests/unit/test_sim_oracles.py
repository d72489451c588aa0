"""The offline references: the oracle that knows whether blocks come back but not when, and
the one that knows each read count's times to the next request, on hand-checked traces and
below the optimum on random ones."""

from __future__ import annotations

import math
import random

import pytest

from crescent.sim.belady import OptimalPool, optimal_hit_rate
from crescent.sim.oracles import AGE_BINS, ClassAgeOraclePool, ReturnOraclePool, hit_density
from crescent.sim.pool import BlockPool
from tests.unit.sim_traces import HAND_TRACE, random_trace


def _oracle_hits(trace: list[list[int]], capacity: int | None) -> list[int]:
    pool = ReturnOraclePool(trace, capacity)
    return [pool.access(ids, float(t)) for t, ids in enumerate(trace)]


def test_the_return_oracle_drops_blocks_never_asked_for_again_first() -> None:
    # Room for 2. After [3]: 2 (never again) goes, not 3, which LRU would keep over 2 anyway;
    # after [1, 4]: 4 (never again) goes, not 3 (LRU drops 3 and misses it next).
    trace = [[1, 2], [3], [1, 4], [3]]
    assert _oracle_hits(trace, 2) == [0, 0, 1, 1]
    lru = BlockPool(2, "lru")
    assert [lru.access(ids, float(t)) for t, ids in enumerate(trace)] == [0, 0, 1, 0]


def test_the_return_oracle_does_not_know_when() -> None:
    # Room for 1; 1 and 2 both come back. The oracle keeps the more recent (2) and misses 1,
    # then keeps 1 over 2 (both come back), then 1 over 2 (never again) and finds 1 at last;
    # the optimum keeps 1, needed sooner, and finds it twice.
    trace = [[1], [2], [1], [2], [1]]
    assert _oracle_hits(trace, 1) == [0, 0, 0, 0, 1]
    optimum = OptimalPool(trace, 1)
    assert [optimum.access(ids) for ids in trace] == [0, 0, 1, 0, 1]


@pytest.mark.parametrize("seed", range(3))
def test_the_return_oracle_stays_below_the_optimum(seed: int) -> None:
    rng = random.Random(seed)
    trace = random_trace(rng, 300)
    for capacity in (2, 8, 30, None):
        pool = ReturnOraclePool(trace, capacity)
        for t, ids in enumerate(trace):
            pool.access(ids, float(t))
        assert pool.hits <= pool.requested and len(pool) <= (capacity or len(pool))
        assert pool.hit_rate <= optimal_hit_rate(trace, capacity) + 1e-12
    with pytest.raises(ValueError, match="request 0"):
        ReturnOraclePool(HAND_TRACE, 2).access(HAND_TRACE[1], 0.0)


def test_hit_density_by_age_on_two_hand_checked_blocks() -> None:
    # One block of the class is asked for again 10 s on, the other never.
    density = hit_density([10.0, math.inf])
    # Fresh: held just past 10 s (the first bin edge x >= 10), both cost that long, one hit.
    first_past_ten = min(x for x in AGE_BINS if x >= 10)
    assert density[0] == pytest.approx(1 / (10 + first_past_ten))
    assert max(density) > density[0]  # nearer its return, a held block gives more a second
    assert all(d == 0 for age, d in zip(AGE_BINS, density, strict=True) if age >= 10)
    assert hit_density([math.inf] * 3) == [0.0] * len(AGE_BINS)


def test_the_class_age_oracle_keeps_the_class_that_comes_back_soon() -> None:
    # Room for 1. Block 1 comes back every 10-20 s; 2 and 3, new, never. Knowing that blocks
    # read before come back soon and new ones seldom, the oracle keeps 1 over each newcomer;
    # LRU keeps the newcomer and misses 1 twice.
    trace = [[1], [1], [2], [1], [3], [1]]
    times = [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]
    oracle = ClassAgeOraclePool(trace, times, 1, rerank_every=1)
    assert [oracle.access(ids, t) for ids, t in zip(trace, times, strict=True)] == [
        0,
        1,
        0,
        1,
        0,
        1,
    ]
    lru = BlockPool(1, "lru")
    assert [lru.access(ids, t) for ids, t in zip(trace, times, strict=True)] == [0, 1, 0, 0, 0, 0]


@pytest.mark.parametrize("seed", range(3))
def test_the_class_age_oracle_stays_below_the_optimum(seed: int) -> None:
    rng = random.Random(seed)
    trace = random_trace(rng, 300)
    times = [float(t) for t in range(len(trace))]
    for capacity in (2, 8, 30, None):
        pool = ClassAgeOraclePool(trace, times, capacity)
        for ids, t in zip(trace, times, strict=True):
            pool.access(ids, t)
        assert pool.hit_rate <= optimal_hit_rate(trace, capacity) + 1e-12
        assert len(pool) <= (capacity or len(pool))
