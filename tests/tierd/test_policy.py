"""Eviction policies: exact victim orders on hand-built chains, and the prefix invariant on
random forests."""

from __future__ import annotations

import random
from typing import Any

import pytest

from services.tierd.policy import (
    BlockInfo,
    CrescentPolicy,
    LfuPolicy,
    LruPolicy,
    RecomputeAwarePolicy,
    RecomputeModel,
    admits,
    chain_depths,
    make_policy,
)
from services.tierd.reuse import ReuseStatistics
from tests.tierd.infos import FOREST, ROOT, block, blocks, h, names


def test_lru_cuts_chains_from_the_tail() -> None:
    lru = LruPolicy()
    # Leaves first: b1 (4) is the oldest leaf; then b0 (3) is a leaf; then c2 (7), a2 (9); a1
    # only once both its children went.
    assert names(lru.victims(FOREST, 60, now=10)) == ["b1", "b0", "c2", "a2", "a1", "a0"]
    assert names(lru.victims(FOREST, 15, now=10)) == ["b1", "b0"]
    assert names(lru.victims(FOREST, 10, now=10)) == ["b1"]
    assert lru.victims(FOREST, 0, now=10) == []
    # More than there is: everything, still tail first.
    assert len(lru.victims(FOREST, 10_000, now=10)) == 6


def test_ties_go_to_the_deeper_block_then_the_lower_hash() -> None:
    tied = blocks(
        block("x0", depth=0, last=5),
        block("y0", depth=0, last=5),
        block("z0", depth=0, last=5),
        block("z1", "z0", depth=1, last=5),
    )
    assert names(LruPolicy().victims(tied, 40, now=10)) == ["z1", "x0", "y0", "z0"]


def test_lfu_goes_by_count_then_recency() -> None:
    lfu = LfuPolicy()
    # Leaves a2 (count 1), b1 (2), c2 (3): a2 first, then b1; its parent b0 (2, older) comes
    # before c2 (3); then a1 (5) and a0 (9).
    assert names(lfu.victims(FOREST, 60, now=10)) == ["a2", "b1", "b0", "c2", "a1", "a0"]
    same_count = blocks(block("p", last=8, count=4), block("q", last=6, count=4))
    assert names(lfu.victims(same_count, 10, now=10)) == ["q"]


def test_recompute_evicts_what_is_cheap_to_recompute_per_byte() -> None:
    # seconds(depth) = 4·1 + 1·4·(4·depth + 2) = 12 + 16·depth with these coefficients.
    model: dict[str, Any] = dict(block_size=4, base_s=0.0, per_token_s=1.0, per_attention_s=1.0)
    assert RecomputeModel(**model).seconds(0) == 12 and RecomputeModel(**model).seconds(2) == 44
    policy = RecomputeAwarePolicy(**model)
    infos = blocks(
        block("deep", depth=2, size=10, last=1),  # 4.4 s/B
        block("shallow", depth=0, size=10, last=9),  # 1.2 s/B
        block("big", depth=2, size=40, last=9),  # 1.1 s/B
        block("tie", depth=0, size=10, last=5),  # 1.2 s/B, older than shallow
    )
    assert names(policy.victims(infos, 40, now=10)) == ["big"]
    assert names(policy.victims(infos, 60, now=10)) == ["big", "tie", "shallow"]
    # A chain is still cut from the tail, however dear the tail is.
    chain = blocks(block("r0", depth=0, size=10), block("r1", "r0", depth=1, size=10))
    assert names(policy.victims(chain, 20, now=0)) == ["r1", "r0"]


def _learned(top: int = 2, **counts: int) -> ReuseStatistics:
    """Statistics that saw ``c<k>`` blocks reach exactly k reads (and ``more`` beyond top)."""
    stats = ReuseStatistics(top=top, smoothing=1e-9)
    for name, n in counts.items():
        reads = top + 1 if name == "more" else int(name[1:])
        for _ in range(n):
            stats.observe(reads)
    return stats


def test_crescent_weighs_learned_reuse_against_recompute_cost() -> None:
    # Learned: of 80 blocks stored, 20 were read; of those, 10 again; 10 more reached 2 reads
    # (from remembered counts) and went on 30 times: P(again) = 1/4, 1/2, 3/4 for 0, 1, 2+.
    stats = _learned(c0=80, c1=20, c2=10, more=30)
    assert stats.table() == pytest.approx([0.25, 0.5, 0.75])
    model: dict[str, Any] = dict(block_size=4, base_s=0.0, per_token_s=1.0, per_attention_s=1.0)
    policy = CrescentPolicy(half_life_s=10, cost_weight=1, reuse=stats, **model)
    now = 100.0
    hot = block("hot", depth=0, last=now, count=3)  # 3/4
    faded = block("faded", depth=0, last=now - 10, count=3)  # 3/4, halved
    fresh = block("fresh", depth=0, last=now, count=0)  # 1/4
    deep = block("deep", depth=3, last=now, count=0)  # 1/4, 60 s to recompute
    assert policy.reuse_probability(hot) == pytest.approx(0.75)
    assert policy.value(faded, now) == pytest.approx(0.375 * 12 / 10)
    assert policy.value(fresh, now) == pytest.approx(0.25 * 12 / 10)
    assert policy.value(deep, now) == pytest.approx(0.25 * 60 / 10)
    infos = blocks(hot, faded, fresh, deep)
    # Values 0.3 (fresh), 0.45 (faded), 0.9 (hot), 1.5 (deep): the never-read deep block
    # outlasts the popular shallow one, which saves a fifth as much per hit.
    assert names(policy.victims(infos, 40, now=now)) == ["fresh", "faded", "hot", "deep"]
    # Reuse alone: the deep block is as fresh and as likely as the fresh one, and deeper.
    by_reuse = CrescentPolicy(half_life_s=10, cost_weight=0, reuse=stats, **model)
    assert names(by_reuse.victims(infos, 40, now=now)) == ["deep", "fresh", "faded", "hot"]
    # Time passing without reads makes even a hot block cheap: 100 s is ten half-lives.
    later = blocks(hot, block("other", depth=0, last=now + 100, count=0))
    assert names(policy.victims(later, 10, now=now + 100)) == ["hot"]


def test_crescent_is_lru_until_it_learns_and_refreshes_its_ranks() -> None:
    policy = CrescentPolicy(half_life_s=10)
    infos = blocks(block("old-hot", last=1, count=5), block("mid", last=3), block("new", last=5))
    # Nothing learned: every count has an even chance, so least recent first.
    assert names(policy.victims(infos, 30, now=6)) == ["old-hot", "mid", "new"]
    # The tier stores ten blocks for each one it reads nine times over: a block once read is
    # read again, one never read seldom is. Ranks move only at the first refresh.
    rounds = [0] * 10 + list(range(1, 10))
    observed = (rounds * CrescentPolicy.refresh_first)[: CrescentPolicy.refresh_first]
    for reads in observed[:-1]:
        policy.observe(reads)
    assert policy.rank_version == 0
    assert names(policy.victims(infos, 30, now=6)) == ["old-hot", "mid", "new"]
    policy.observe(observed[-1])
    assert policy.rank_version == 1
    assert policy.reuse_probability(infos[h("old-hot")]) > 0.9
    assert policy.reuse_probability(infos[h("new")]) < 0.2
    # Read five times, it outlives two blocks never read though they are fresher.
    assert names(policy.victims(infos, 30, now=6)) == ["mid", "new", "old-hot"]


@pytest.mark.parametrize("cost_weight", [0.0, 0.25, 1.0])
def test_crescent_ranks_by_value_whatever_the_clock(cost_weight: float) -> None:
    # The rank is the log of the value at time 0, so it orders blocks as their value does at
    # any later time, and the rank itself never moves with the clock.
    rng = random.Random(int(cost_weight * 100))
    stats = _learned(top=4, c0=100, c1=40, c2=30, c3=10, c4=9, more=30)
    policy = CrescentPolicy(half_life_s=30, cost_weight=cost_weight, reuse=stats)
    infos = [
        block(f"b{i}", depth=rng.randrange(40), last=rng.uniform(0, 100), count=rng.randrange(9))
        for i in range(40)
    ]
    for now in (100.0, 250.0, 1000.0):
        by_rank = sorted(infos, key=lambda i: policy.rank(i, now))
        values = [policy.value(i, now) for i in by_rank]
        assert values == sorted(values)
        assert all(policy.rank(i, now) == policy.rank(i, 0.0) for i in infos)
    with pytest.raises(ValueError, match="half_life_s"):
        CrescentPolicy(half_life_s=0)


def _random_forest(rng: random.Random, n: int) -> dict[bytes, BlockInfo]:
    infos: dict[bytes, BlockInfo] = {}
    keys: list[bytes] = []
    for i in range(n):
        parent_info = infos[rng.choice(keys)] if keys and rng.random() < 0.8 else None
        info = BlockInfo(
            block_hash=i.to_bytes(16, "big"),
            parent_hash=parent_info.block_hash if parent_info else ROOT,
            num_bytes=rng.choice([1, 5, 10, 100]),
            depth=parent_info.depth + 1 if parent_info else 0,
            created_at=0.0,
            last_access=float(rng.randrange(20)),
            access_count=rng.randrange(4),
            quota_key=rng.choice([b"a", b"b"]),
        )
        infos[info.block_hash] = info
        keys.append(info.block_hash)
    # Some blocks whose parent is not held (evicted, or in another tier).
    for key in rng.sample(keys, n // 10):
        infos.pop(key)
    return infos


def _reference(
    policy: Any, infos: dict[bytes, BlockInfo], need: int, now: float, quota: bytes | None
) -> list[bytes]:
    """The same choice by full re-sorting per victim: slow but obviously right."""
    left = dict(infos)
    out: list[bytes] = []
    freed = 0
    while freed < need:
        parents = {i.parent_hash for i in left.values()}
        ok = [
            i for i in left.values() if i.block_hash not in parents and quota in (None, i.quota_key)
        ]
        if not ok:
            break
        best = min(ok, key=lambda i: (policy.rank(i, now), -i.depth, i.block_hash))
        out.append(best.block_hash)
        freed += best.num_bytes
        del left[best.block_hash]
    return out


@pytest.mark.parametrize("name", ["lru", "lfu", "recompute", "crescent"])
def test_no_victim_ever_has_a_surviving_child(name: str) -> None:
    rng = random.Random(name)
    policy = make_policy(name)
    for _ in range(60):
        infos = _random_forest(rng, rng.randrange(1, 60))
        need = rng.randrange(0, 800)
        quota = rng.choice([None, b"a", b"b"])
        victims = policy.victims(infos, need, now=20.0, quota_key=quota)
        gone: set[bytes] = set()
        for victim in victims:
            children = {k for k, i in infos.items() if i.parent_hash == victim}
            assert children <= gone, "evicted a block whose child survives"
            assert quota is None or infos[victim].quota_key == quota
            gone.add(victim)
        assert len(gone) == len(victims)
        assert victims == _reference(policy, infos, need, 20.0, quota)


def test_make_policy_knows_its_names() -> None:
    assert {make_policy(n).name for n in ("lru", "lfu", "recompute", "crescent")} == {
        "lru",
        "lfu",
        "recompute",
        "crescent",
    }
    crescent = make_policy("crescent", half_life_s=5, cost_weight=0.5, block_size=16)
    assert isinstance(crescent, CrescentPolicy) and crescent.half_life_s == 5
    assert crescent.cost_weight == 0.5
    assert crescent.model.block_size == 16
    with pytest.raises(ValueError, match="unknown eviction policy"):
        make_policy("fifo")
    with pytest.raises(TypeError):
        make_policy("lru", half_life_s=5)


def test_admission_keeps_cold_blocks_from_displacing_hot_ones() -> None:
    policy = LfuPolicy()
    hot = block("hot", count=9, last=1)
    cold = block("cold", count=0, last=2)
    assert admits(policy, hot, [cold], now=3)
    assert not admits(policy, cold, [hot], now=3)
    assert admits(policy, cold, [], now=3)


def test_chain_depths_counts_within_what_is_held() -> None:
    parents = {h("a0"): ROOT, h("a1"): h("a0"), h("a2"): h("a1"), h("x5"): h("gone")}
    assert chain_depths(parents) == {h("a0"): 0, h("a1"): 1, h("a2"): 2, h("x5"): 0}
