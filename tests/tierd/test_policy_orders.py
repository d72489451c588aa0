"""Every policy's exact victim order, prefix-aware (a block leading to held blocks goes after
them) and scoped to a tenant, and the cost of choosing among a hundred thousand blocks."""

from __future__ import annotations

import random

import pytest

from services.tierd.policy import POLICIES, BlockInfo, LruPolicy, make_policy
from tests.tierd.infos import FOREST, ROOT, block, blocks, h, names

# Each policy's full order on FOREST (now = 10), worked out by hand from its rank:
# recompute: b1 (depth 1) is cheaper than a2 and c2 (depth 2), then its parent b0 (depth 0),
#   then c2 before a2 (same depth, older), a1 once both its children went, a0.
# crescent, before it has learned anything (see test_policy.py for what it learns): every
#   read count has an even chance of reuse, so it orders as lru does.
FOREST_ORDERS = {
    "lru": ["b1", "b0", "c2", "a2", "a1", "a0"],
    "lfu": ["a2", "b1", "b0", "c2", "a1", "a0"],
    "recompute": ["b1", "b0", "c2", "a2", "a1", "a0"],
    "crescent": ["b1", "b0", "c2", "a2", "a1", "a0"],
}


@pytest.mark.parametrize("name", sorted(FOREST_ORDERS))
def test_every_policy_gives_its_exact_order_on_a_forest(name: str) -> None:
    policy = make_policy(name)
    order = FOREST_ORDERS[name]
    assert names(policy.victims(FOREST, 60, now=10)) == order
    # Asking for less takes a prefix of the same order, stopping once enough is freed.
    for count in range(1, 7):
        assert names(policy.victims(FOREST, 10 * count - 5, now=10)) == order[:count]


@pytest.mark.parametrize("name", ["lru", "lfu", "recompute", "crescent"])
def test_a_head_ranked_lowest_still_waits_for_its_descendants(name: str) -> None:
    # h0 is the block every policy ranks lowest (oldest, never used, shallowest), yet it
    # leads to h1 and h2: it goes last, after the lone x0 and its own tail.
    infos = blocks(
        block("h0", depth=0, last=0, count=0),
        block("h1", "h0", depth=1, last=5, count=5),
        block("h2", "h1", depth=2, last=9, count=9),
        block("x0", depth=0, last=7, count=7),
    )
    policy = POLICIES[name]()
    assert all(
        policy.rank(infos[h("h0")], 10) < policy.rank(other, 10)
        for key, other in infos.items()
        if key != h("h0")
    )
    assert names(policy.victims(infos, 40, now=10)) == ["x0", "h2", "h1", "h0"]
    assert names(policy.victims(infos, 20, now=10)) == ["x0", "h2"]
    # A parent that is not held (evicted, or in another tier) protects nothing.
    del infos[h("h0")]
    assert names(policy.victims(infos, 10, now=10))[0] in {"x0", "h2"}


# Their t0 and s1 tie on recency and use; the deeper s1 wins the tie under lru, lfu and
# crescent (which weighs no cost by default), while recompute evicts the shallow t0 first
# (cheaper to recompute).
THEIR_ORDERS = {
    "lru": ["s1", "t0"],
    "lfu": ["s1", "t0"],
    "recompute": ["t0", "s1"],
    "crescent": ["s1", "t0"],
}


@pytest.mark.parametrize("name", sorted(THEIR_ORDERS))
def test_a_quota_key_confines_the_victims(name: str) -> None:
    mine, theirs = b"tenant-a", b"tenant-b"
    infos = blocks(
        block("m0", depth=0, last=1, quota=mine),
        block("m1", "m0", depth=1, last=2, quota=mine),
        block("t0", depth=0, last=0, quota=theirs),
        # Their block continues my chain: m1 has a surviving child, so it is protected.
        block("s0", depth=0, last=1, quota=mine),
        block("s1", "s0", depth=1, last=0, quota=theirs),
    )
    policy = make_policy(name)
    assert names(policy.victims(infos, 100, now=5, quota_key=mine)) == ["m1", "m0"]
    assert names(policy.victims(infos, 100, now=5, quota_key=theirs)) == THEIR_ORDERS[name]
    assert policy.victims(infos, 100, now=5, quota_key=b"nobody") == []
    # Once their s1 goes, my s0 (older and shallower than m1: every policy's lowest) is a
    # leaf again, and my first victim.
    del infos[h("s1")]
    assert names(policy.victims(infos, 100, now=5, quota_key=mine)) == ["s0", "m1", "m0"]


class _CountingLru(LruPolicy):
    """LRU that counts how often it ranks a block."""

    def __init__(self) -> None:
        self.ranked = 0

    def rank(self, info: BlockInfo, now: float) -> tuple[float, ...]:
        self.ranked += 1
        return super().rank(info, now)


def test_a_hundred_thousand_blocks_rank_each_block_once() -> None:
    # Each block is ranked once, when it becomes evictable: no re-sorting per victim, so a
    # full NVMe of small blocks costs one heap pass.
    rng = random.Random(1)
    infos: dict[bytes, BlockInfo] = {}
    for chain in range(2_000):
        parent = ROOT
        for depth in range(50):
            key = (chain * 100 + depth).to_bytes(16, "big")
            infos[key] = BlockInfo(key, parent, 1000, depth, 0.0, rng.random(), 1)
            parent = key
    policy = _CountingLru()
    victims = policy.victims(infos, 50_000_000, now=1.0)
    assert len(victims) == 50_000 and len(set(victims)) == 50_000
    assert policy.ranked <= 2_000 + len(victims)
    position = {victim: i for i, victim in enumerate(victims)}
    for victim in victims:  # every chain cut from its tail: a block's child went before it
        if infos[victim].depth < 49:
            child = (int.from_bytes(victim, "big") + 1).to_bytes(16, "big")
            assert position[child] < position[victim]
