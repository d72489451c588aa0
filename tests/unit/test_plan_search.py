"""The plan's search over cluster shapes, on made-up clusters whose every shape is known: it
finds the cheapest shape a full grid would, with far fewer simulations, each shape simulated
once, its two smaller neighbours simulated and failing, and a cut search saying so."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Callable

import pytest

from crescent.plan.search import plan
from crescent.plan.shapes import Limits, Objectives, Outcome, Plan, Shape

OBJECTIVES = Objectives(ttft_s=1.0, tpot_s=0.1, attainment=0.9)


class Population:
    """A made-up cluster: request ``i`` meets its TTFT objective with at least ``need_p[i]``
    prefill nodes and its TPOT objective with at least ``need_d[i]`` decode nodes, so each
    share of misses depends on one count alone and attainment is monotone in both."""

    def __init__(self, rng: random.Random, requests: int = 200, p: int = 12, d: int = 6) -> None:
        self.need_p = [max(1, round(rng.gauss(p, p / 4))) for _ in range(requests)]
        self.need_d = [max(1, round(rng.gauss(d, d / 3))) for _ in range(requests)]
        self.calls: Counter[Shape] = Counter()

    def attainment(self, shape: Shape) -> float:
        met = sum(
            1
            for a, b in zip(self.need_p, self.need_d, strict=True)
            if shape.prefill >= a and shape.decode >= b
        )
        return met / len(self.need_p)

    def __call__(self, shape: Shape) -> Outcome:
        self.calls[shape] += 1
        n = len(self.need_p)
        return Outcome(
            shape=shape,
            attainment=self.attainment(shape),
            ttft_s=0.0,
            tpot_s=0.0,
            ttft_missed=sum(shape.prefill < a for a in self.need_p) / n,
            tpot_missed=sum(shape.decode < b for b in self.need_d) / n,
            requests=n,
            rejected=0,
        )


def cheapest(attainment: Callable[[Shape], float], limits: Limits) -> int | None:
    """The fewest nodes of any meeting shape, by trying every one."""
    totals = [
        p + d
        for p, d in itertools.product(
            range(1, limits.max_prefill + 1), range(1, limits.max_decode + 1)
        )
        if attainment(Shape(p, d)) >= OBJECTIVES.attainment
    ]
    return min(totals, default=None)


def assert_settled(found: Plan) -> None:
    assert found.best is not None
    assert found.best.attainment >= OBJECTIVES.attainment
    assert [s for s, _ in found.smaller] == list(found.best.shape.smaller())
    for _, neighbour in found.smaller:
        assert neighbour is not None and neighbour.attainment < OBJECTIVES.attainment


@pytest.mark.parametrize("seed", range(8))
def test_it_finds_the_cheapest_shape_of_the_grid(seed: int) -> None:
    rng = random.Random(seed)
    cluster = Population(rng, p=rng.randint(2, 30), d=rng.randint(1, 12))
    limits = Limits(max_prefill=48, max_decode=24, simulations=60)
    found = plan(cluster, OBJECTIVES, limits)
    assert found.best is not None and not found.cut
    assert found.best.shape.nodes == cheapest(cluster.attainment, limits)
    assert_settled(found)
    assert max(cluster.calls.values()) == 1  # no shape twice
    assert len(found.tried) == sum(cluster.calls.values())
    assert len(found.tried) < 40  # of 48 x 24 = 1,152 shapes


def groups(*kinds: tuple[int, int, int]) -> Population:
    """A population of ``count`` requests needing ``p`` prefill and ``d`` decode nodes, for
    each ``(count, p, d)``."""
    cluster = Population(random.Random(0), requests=0)
    for count, p, d in kinds:
        cluster.need_p += [p] * count
        cluster.need_d += [d] * count
    return cluster


def test_a_trade_beats_the_corner_the_bisections_reach() -> None:
    # 90% is every request of the 80 plus one group of 10: with 3 prefill and 14 decode
    # nodes (17), or with 6 and 9 (15). Bisecting prefill first reaches 3 + 14; the walk
    # along the shapes of one node fewer finds the other way.
    cluster = groups((80, 2, 9), (10, 3, 14), (10, 6, 9))
    limits = Limits(32, 32, 60)
    found = plan(cluster, OBJECTIVES, limits)
    assert found.best is not None
    assert found.best.shape == Shape(6, 9)
    assert cheapest(cluster.attainment, limits) == 15
    assert Shape(3, 14) in {o.shape for o in found.tried}  # the corner it traded from
    assert_settled(found)


def test_a_shape_that_meets_below_a_failure_is_taken() -> None:
    # Nearly monotone: every request needs 6 + 4, but 5 + 4 meets by luck of the draw.
    # Settling simulates the answer's neighbours, so the answer moves down to it.
    cluster = groups((100, 6, 4))
    honest = cluster.__call__

    def lucky(shape: Shape) -> Outcome:
        found = honest(shape)
        if shape == Shape(5, 4):
            return Outcome(shape, 0.95, 0.0, 0.0, 0.05, 0.0, found.requests, 0)
        return found

    found = plan(lucky, OBJECTIVES, Limits(32, 32, 80))
    assert found.best is not None
    assert found.best.shape == Shape(5, 4)
    assert_settled(found)


def test_a_search_cut_short_says_so_and_keeps_the_best_found() -> None:
    cluster = Population(random.Random(1), p=20, d=6)
    found = plan(cluster, OBJECTIVES, Limits(64, 64, simulations=7))
    assert found.cut
    assert len(found.tried) == 7
    met = [o for o in found.tried if o.attainment >= OBJECTIVES.attainment]
    if found.best is None:
        assert not met
    else:
        assert found.best.shape.nodes == min(o.shape.nodes for o in met)


def test_no_shape_within_the_caps() -> None:
    cluster = Population(random.Random(2), p=40, d=3)
    found = plan(cluster, OBJECTIVES, Limits(max_prefill=16, max_decode=16, simulations=40))
    assert found.best is None and not found.cut
    assert found.smaller == ()
    # It stops once prefill is at its cap and still misses too much: decode cannot help.
    assert found.tried[-1].shape.prefill == 16
    assert all(o.shape.prefill < 16 for o in found.tried[:-1])


def test_the_pool_that_misses_grows_first() -> None:
    # Decode is never short: the bracket doubles prefill alone.
    cluster = Population(random.Random(4), p=20, d=1)
    cluster.need_d = [1] * len(cluster.need_d)
    found = plan(cluster, OBJECTIVES, Limits(64, 64, 40))
    shapes = [o.shape for o in found.tried]
    assert shapes[:5] == [Shape(1, 1), Shape(2, 1), Shape(4, 1), Shape(8, 1), Shape(16, 1)]
    assert found.best is not None and found.best.shape.decode == 1
    assert_settled(found)
    assert len(found.smaller) == 1  # no shape has fewer than one decode node
