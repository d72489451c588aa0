"""Holdings: copies per tier, each tenant's bytes, victims by tier and tenant, TTL expiry, and
no held block ever cut off from its prefix."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from services.tierd.holdings import NVME, S3, Holdings
from services.tierd.policy import LfuPolicy, LruPolicy, RecomputeAwarePolicy, make_policy
from shared.kv.block_file import BlockHeader

ROOT = b"root" + bytes(12)
A, B = b"tenant-a", b"tenant-b"


def h(name: str) -> bytes:
    return name.encode().ljust(16, b".")


def names(hashes: list[bytes]) -> list[str]:
    return [x.rstrip(b".").decode() for x in hashes]


def header(
    name: str, parent: str | None = None, *, size: int = 100, quota: bytes = b""
) -> BlockHeader:
    return BlockHeader(
        block_hash=h(name),
        parent_hash=h(parent) if parent else ROOT,
        token_ids=(1, 2, 3, 4),
        checksum=0,
        num_bytes=size,
        model_id="m",
        block_size=4,
        kv_dtype="float32",
        quota_key=quota,
    )


def chain(prefix: str, length: int, *, size: int = 100, quota: bytes = b"") -> list[BlockHeader]:
    """``prefix0 <- prefix1 <- ...``."""
    out: list[BlockHeader] = []
    for i in range(length):
        parent = f"{prefix}{i - 1}" if i else None
        out.append(header(f"{prefix}{i}", parent, size=size, quota=quota))
    return out


def test_copies_per_tier_and_the_last_one() -> None:
    held = Holdings(LruPolicy())
    x = header("x", quota=A)
    held.add(x, NVME, now=1)
    held.add(x, S3, now=2)
    held.add(x, S3, now=3)  # a second record of one copy changes nothing
    assert h("x") in held and held.tiers_of(h("x")) == {NVME, S3}
    assert held.quota_used == {A: 100}
    assert held.blocks[h("x")].last_access == 1  # a known block is not "just used" again
    assert held.remove(h("x"), NVME) is False
    assert held.tiers_of(h("x")) == {S3} and held.quota_used == {A: 100}
    assert held.remove(h("x"), NVME) is False  # no copy there: nothing changes
    assert held.tiers_of(h("x")) == {S3}
    assert held.remove(h("x"), S3) is True
    assert h("x") not in held and held.tiers_of(h("x")) == set()
    assert held.quota_used == {}
    assert held.remove(h("x"), S3) is False
    # tiers_of hands out a copy, never the holding itself.
    held.add(x, NVME, now=4)
    held.tiers_of(h("x")).add(S3)
    assert held.tiers_of(h("x")) == {NVME}


def test_bytes_and_quotas_match_what_is_held_through_random_changes() -> None:
    rng = random.Random(7)
    held = Holdings(LruPolicy())
    pool = [
        header(f"b{i}", size=rng.choice([0, 1, 64, 4096]), quota=rng.choice([b"", A, B]))
        for i in range(40)
    ]
    copies: dict[bytes, set[str]] = defaultdict(set)
    for step in range(2_000):
        block, tier = rng.choice(pool), rng.choice([NVME, S3])
        if rng.random() < 0.55:
            held.add(block, tier, now=step)
            copies[block.block_hash].add(tier)
        else:
            had = copies[block.block_hash]
            last = had == {tier}
            assert held.remove(block.block_hash, tier) is last
            had.discard(tier)
        by_key: dict[bytes, int] = defaultdict(int)
        for b in pool:
            if copies[b.block_hash]:
                by_key[b.quota_key] += b.num_bytes
        assert held.quota_used == {k: v for k, v in by_key.items() if v > 0}
        assert all(v > 0 for v in held.quota_used.values())
        assert set(held.blocks) == {b.block_hash for b in pool if copies[b.block_hash]}
        for tier_name in (NVME, S3):
            expected = sum(b.num_bytes for b in pool if tier_name in copies[b.block_hash])
            assert held.bytes_in(tier_name) == expected


def test_blocks_of_no_bytes_never_break_the_accounting() -> None:
    held = Holdings(LruPolicy())
    held.add(header("empty", quota=A, size=0), NVME, now=0)
    assert held.quota_used == {}  # a key with nothing held is absent
    held.add(header("full", quota=A, size=10), NVME, now=0)
    assert held.remove(h("full"), NVME) is True
    assert held.remove(h("empty"), NVME) is True
    assert held.quota_used == {} and not held.blocks


def test_touch_counts_uses_and_never_goes_back_in_time() -> None:
    held = Holdings(LfuPolicy())
    for block in (header("p"), header("q")):
        held.add(block, NVME, now=10)
    held.touch([h("p"), h("p"), h("nobody")], now=20)
    held.touch([h("p")], now=15)
    p = held.blocks[h("p")]
    assert (p.last_access, p.access_count) == (20, 3)
    assert held.blocks[h("q")].access_count == 0
    assert names(held.victims(100, now=30)) == ["q"]
    assert names(under_lru(held).victims(100, now=30)) == ["q"]


def under_lru(other: Holdings) -> Holdings:
    """The same blocks and uses, ranked by LRU."""
    held = Holdings(LruPolicy())
    held.blocks, held.quota_used = other.blocks, other.quota_used
    return held


def test_victims_of_a_tier_are_only_its_own_in_policy_order() -> None:
    held = Holdings(LruPolicy())
    nvme, s3 = chain("n", 3), chain("s", 3)
    for i, block in enumerate(nvme):
        held.add(block, NVME, now=10 + i)
    for i, block in enumerate(s3):
        held.add(block, S3, now=i)  # colder than anything on NVMe
    shared = header("both")
    held.add(shared, NVME, now=5)
    held.add(shared, S3, now=5)
    assert names(held.victims(10_000, now=50, tier=NVME)) == ["both", "n2", "n1", "n0"]
    assert names(held.victims(10_000, now=50, tier=S3)) == ["s2", "s1", "s0", "both"]
    assert names(held.victims(10_000, now=50)) == ["s2", "s1", "s0", "both", "n2", "n1", "n0"]
    assert names(held.victims(150, now=50, tier=NVME)) == ["both", "n2"]
    assert held.victims(0, now=50, tier=NVME) == []
    assert held.victims(100, now=50, tier="elsewhere") == []


def test_victims_of_a_tenant_are_only_its_own() -> None:
    held = Holdings(LruPolicy())
    for i, block in enumerate(chain("a", 3, quota=A)):
        held.add(block, NVME, now=10 + i)
    for i, block in enumerate(chain("b", 3, quota=B)):
        held.add(block, S3, now=i)
    assert names(held.victims(10_000, now=50, quota_key=A)) == ["a2", "a1", "a0"]
    assert names(held.victims(10_000, now=50, quota_key=B)) == ["b2", "b1", "b0"]
    assert held.victims(10_000, now=50, quota_key=B, tier=NVME) == []
    assert held.victims(10_000, now=50, quota_key=b"nobody") == []


def test_a_tenant_over_its_quota_gives_up_its_own_blocks() -> None:
    held = Holdings(LruPolicy())
    for i, block in enumerate(chain("b", 4, quota=B)):
        held.add(block, NVME, now=i)  # B's blocks are the coldest of all
    for i, block in enumerate(chain("a", 4, quota=A)):
        held.add(block, NVME, now=10 + i)
    quota = 400
    assert held.over_quota(A, 0, quota) == 0
    assert held.over_quota(A, 150, quota) == 150
    assert held.over_quota(b"nobody", 150, quota) == 0
    excess = held.over_quota(A, 150, quota)
    victims = held.victims(excess, now=20, quota_key=A)
    assert names(victims) == ["a3", "a2"]  # A's tail, although B's blocks are colder
    for victim in victims:
        held.remove(victim, NVME)
    assert held.over_quota(A, 150, quota) == 0
    assert held.quota_used == {A: 200, B: 400}
    # The globally coldest blocks, for contrast, are B's.
    assert names(held.victims(100, now=20)) == ["b3"]


def test_a_tail_is_priced_by_its_whole_chain_across_tiers() -> None:
    held = Holdings(RecomputeAwarePolicy())
    deep = chain("d", 4)
    for block in deep[:3]:
        held.add(block, S3, now=0)
    held.add(deep[3], NVME, now=0)  # the tail alone on NVMe: depth 3, dear to recompute
    held.add(header("lone"), NVME, now=9)  # recently used, but cheap: a chain of one
    assert names(held.victims(100, now=10, tier=NVME)) == ["lone"]
    assert names(under_lru(held).victims(100, now=10, tier=NVME)) == ["d3"]


def test_the_last_copy_of_a_head_stays_while_its_tail_is_held_higher() -> None:
    # A chain moved down to S3, then continued on NVMe by a later turn: dropping its S3-only
    # head would strand the NVMe tail (reads stop at the first gap).
    held = Holdings(LruPolicy())
    turn1, turn2 = chain("t", 3), [header("t3", "t2"), header("t4", "t3")]
    for block in turn1:
        held.add(block, S3, now=0)
    for block in turn2:
        held.add(block, NVME, now=5)
    held.add(header("cold"), S3, now=1)
    assert names(held.victims(10_000, now=10, tier=S3)) == ["cold"]
    # The tail goes down too: the chain is whole in S3 and is cut from its tail there.
    for block in turn2:
        held.add(block, S3, now=5)
        held.remove(block.block_hash, NVME)
    assert names(held.victims(10_000, now=10, tier=S3)) == ["cold", "t4", "t3", "t2", "t1", "t0"]


def test_a_copy_that_is_not_the_last_may_go_whatever_it_leads_to() -> None:
    held = Holdings(LruPolicy())
    head, tail = header("p0"), header("p1", "p0")
    held.add(head, S3, now=0)
    held.add(head, NVME, now=0)  # read up by a prefetch: S3 kept its copy
    held.add(tail, NVME, now=3)
    assert names(held.victims(10_000, now=10, tier=S3)) == ["p0"]
    # NVMe moves its blocks down, so a tail already in S3 protects nothing there either.
    lone = Holdings(LruPolicy())
    lone.add(head, NVME, now=0)
    lone.add(tail, S3, now=3)
    assert names(lone.victims(10_000, now=10, tier=NVME)) == ["p0"]


@pytest.mark.parametrize("name", ["lru", "lfu", "recompute", "crescent"])
def test_dropping_victims_never_strands_a_held_block(name: str) -> None:
    rng = random.Random(name)
    for _ in range(40):
        held = Holdings(make_policy(name))
        headers: list[BlockHeader] = []
        for i in range(rng.randrange(1, 40)):
            parent = rng.choice(headers).block_hash if headers and rng.random() < 0.8 else ROOT
            block = BlockHeader(
                i.to_bytes(16, "big"), parent, (i,), 0, rng.choice([1, 10, 100]), "m", 4, "f32",
                quota_key=rng.choice([A, B]),
            )  # fmt: skip
            headers.append(block)
            for where in rng.choice([[NVME], [S3], [NVME, S3]]):
                held.add(block, where, now=rng.randrange(20))
        held.touch(rng.sample([b.block_hash for b in headers], len(headers) // 3), now=20)
        scope: list[tuple[str | None, bytes | None]] = [
            (S3, None),
            (None, None),
            (None, A),
            (None, B),
        ]
        tier, quota = rng.choice(scope)
        victims = held.victims(rng.randrange(1, 2_000), now=30, tier=tier, quota_key=quota)
        assert len(set(victims)) == len(victims)
        for victim in victims:
            assert quota is None or held.blocks[victim].header.quota_key == quota
            for copy in sorted(held.tiers_of(victim)) if tier is None else [tier]:
                assert copy in held.tiers_of(victim)
                held.remove(victim, copy)
            # Every parent was held at the start; after each drop, a held block's still is.
            stranded = [
                b
                for b in headers
                if b.block_hash in held and b.parent_hash not in (ROOT, *held.blocks)
            ]
            assert not stranded, "a held block lost its parent"


def test_ttl_takes_unused_chains_tail_first() -> None:
    held = Holdings(LruPolicy())
    old = chain("o", 3)
    for block in old:
        held.add(block, NVME, now=0)
    held.add(header("fresh"), NVME, now=95)
    held.add(header("edge"), S3, now=40)
    assert names(held.expired(now=100, ttl_s=60)) == ["o2", "o1", "o0"]
    assert held.expired(now=100, ttl_s=1_000) == []
    # Exactly the TTL is not past it.
    # Deepest first, then by hash.
    assert names(held.expired(now=100, ttl_s=60 - 1e-9)) == ["o2", "o1", "edge", "o0"]
    held.touch([h("o0")], now=99)
    assert names(held.expired(now=100, ttl_s=60)) == ["o2", "o1"]


def test_ttl_keeps_a_head_whose_tail_is_still_in_use() -> None:
    # A later turn sank o3 beside an old chain without reading it (a pool only offers what it
    # lacks below): the old head must stay while its new tail does.
    held = Holdings(LruPolicy())
    for block in chain("o", 3):
        held.add(block, S3, now=0)
    held.add(header("o3", "o2"), NVME, now=90)
    held.add(header("other"), NVME, now=0)
    assert names(held.expired(now=100, ttl_s=60)) == ["other"]
    assert names(held.expired(now=200, ttl_s=60)) == ["o3", "o2", "o1", "o0", "other"]
    # A fork: the used branch keeps the stem, the unused branch goes.
    held.add(header("u1", "o0"), NVME, now=150)
    held.add(header("x1", "o0"), NVME, now=0)
    assert names(held.expired(now=200, ttl_s=60)) == ["o3", "o2", "o1", "x1", "other"]


def test_admission_keeps_a_cold_newcomer_from_displacing_hot_blocks() -> None:
    lfu = Holdings(LfuPolicy())
    for block in chain("hot", 2):
        lfu.add(block, NVME, 0.0)
    lfu.touch([h("hot0"), h("hot1")], 1.0)  # read again since they came
    newcomer = header("new")
    victims = lfu.victims(100, 2.0, tier=NVME)
    assert names(victims) == ["hot1"]
    # LFU: never read, it ranks below a block read once, so it may not push that one out.
    assert not lfu.admits(newcomer, victims, 2.0)
    assert lfu.admits(newcomer, [], 2.0)  # nothing displaced: always
    # LRU: the newcomer is the most recent, so it displaces the least recent.
    lru = Holdings(LruPolicy())
    for block in chain("old", 2):
        lru.add(block, NVME, 0.0)
    assert lru.admits(newcomer, lru.victims(100, 2.0, tier=NVME), 2.0)
