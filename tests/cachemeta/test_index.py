"""The pure prefix index: holders per block, longest-prefix matching, holder ids."""

from __future__ import annotations

import random

from services.cachemeta.index import PrefixIndex
from shared.rpc.types import PrefixHolder


def h(i: int) -> bytes:
    return i.to_bytes(16, "big")


CHAIN = [h(i) for i in range(10)]
SIZES = {h(i): 1000 + i for i in range(100)}


def brute_force(
    held: dict[tuple[str, str], set[bytes]], chain: list[bytes], tiers: tuple[str, ...] = ()
) -> list[PrefixHolder]:
    def run(blocks: set[bytes]) -> int:
        n = 0
        while n < len(chain) and chain[n] in blocks:
            n += 1
        return n

    found = {}
    for (node, tier), blocks in held.items():
        if (not tiers or tier in tiers) and run(blocks):
            found[node, tier] = run(blocks)
    if not tiers or {"nvme", "s3"} <= set(tiers):
        # A node's NVMe and S3 read as one: its s3 entry counts the leading blocks in either.
        for node in {n for n, t in found if t in ("nvme", "s3")}:
            both = held.get((node, "nvme"), set()) | held.get((node, "s3"), set())
            if run(both) > max(found.get((node, t), 0) for t in ("nvme", "s3")):
                found[node, "s3"] = run(both)
    listed = [PrefixHolder(node, tier, n) for (node, tier), n in found.items()]
    return sorted(listed, key=lambda p: (-p.num_blocks, p.node_id, p.tier))


def test_match_reports_leading_blocks_per_holder_longest_first() -> None:
    index = PrefixIndex()
    index.add(("a", "dram"), CHAIN[:3], SIZES)
    index.add(("b", "dram"), CHAIN, SIZES)
    index.add(("b", "nvme"), CHAIN[:6], SIZES)
    index.add(("c", "dram"), CHAIN[1:], SIZES)  # misses block 0: holds no leading block
    index.add(("d", "s3"), [*CHAIN[:2], *CHAIN[3:]], SIZES)  # a hole at block 2
    assert index.match(CHAIN) == [
        PrefixHolder("b", "dram", 10),
        PrefixHolder("b", "nvme", 6),
        PrefixHolder("a", "dram", 3),
        PrefixHolder("d", "s3", 2),
    ]
    assert index.match(CHAIN[:1]) == [
        PrefixHolder("a", "dram", 1),
        PrefixHolder("b", "dram", 1),
        PrefixHolder("b", "nvme", 1),
        PrefixHolder("d", "s3", 1),
    ]
    assert index.match([]) == []
    assert index.match([h(99), *CHAIN]) == []


def test_a_chain_split_between_nvme_and_s3_is_one_prefix_of_its_tierd() -> None:
    index = PrefixIndex()
    index.add(("t", "s3"), CHAIN[:2], SIZES)  # the coldest head went on to S3
    index.add(("t", "nvme"), CHAIN[2:7], SIZES)
    index.add(("u", "nvme"), CHAIN[:4], SIZES)
    index.add(("u", "s3"), CHAIN[5:], SIZES)  # a hole at block 4: u serves 4 blocks
    index.add(("v", "dram"), CHAIN[:1], SIZES)
    index.add(("v", "s3"), CHAIN[1:], SIZES)  # a pool and a tierd do not add up
    assert index.match(CHAIN) == [
        PrefixHolder("t", "s3", 7),
        PrefixHolder("u", "nvme", 4),
        PrefixHolder("v", "dram", 1),
    ]
    # Asked for one lower tier only, each counts alone.
    assert index.match(CHAIN, ("s3",)) == [PrefixHolder("t", "s3", 2)]


def test_add_and_remove_count_only_changes() -> None:
    index = PrefixIndex()
    assert index.add(("a", "dram"), CHAIN[:4], SIZES) == 4
    assert index.add(("a", "dram"), CHAIN[2:6], SIZES) == 2
    assert index.add(("a", "nvme"), CHAIN[:2], SIZES) == 2
    assert len(index) == 6 and index.num_replicas == 8
    assert index.replica_bytes == sum(SIZES[b] for b in CHAIN[:6]) + SIZES[h(0)] + SIZES[h(1)]
    # A block keeps the size it was first added with.
    index.add(("b", "dram"), CHAIN[:1], {h(0): 99})
    assert index.replica_bytes == sum(SIZES[b] for b in CHAIN[:6]) + 2 * SIZES[h(0)] + SIZES[h(1)]
    assert index.remove(("b", "dram"), CHAIN) == 1
    assert index.remove(("a", "dram"), [CHAIN[0], h(99), CHAIN[0]]) == 1
    assert index.remove(("zz", "dram"), CHAIN) == 0
    assert index.contains(CHAIN[0])  # still on NVMe
    assert index.remove(("a", "nvme"), CHAIN[:2]) == 2
    assert not index.contains(CHAIN[0]) and index.contains(CHAIN[1])
    assert index.replica_counts() == {"a": 5}
    assert index.replica_bytes == sum(SIZES[b] for b in CHAIN[1:6])


def test_remove_node_frees_holder_ids_for_reuse() -> None:
    index = PrefixIndex()
    index.add(("a", "dram"), CHAIN, SIZES)
    index.add(("a", "nvme"), CHAIN[:5], SIZES)
    index.add(("b", "dram"), CHAIN[:2], SIZES)
    assert index.remove_node("a") == 15
    assert index.holders_of("a") == [] and index.blocks_of(("a", "dram")) == frozenset()
    assert len(index) == 2
    # New holders take the freed ids and must not inherit any of a's blocks.
    index.add(("c", "dram"), CHAIN[5:6], SIZES)
    index.add(("d", "dram"), CHAIN[7:8], SIZES)
    assert index.match(CHAIN) == [PrefixHolder("b", "dram", 2)]
    assert index.match(CHAIN[5:]) == [PrefixHolder("c", "dram", 1)]
    assert index.replica_counts() == {"b": 2, "c": 1, "d": 1}


def test_adding_nothing_allocates_no_holder() -> None:
    index = PrefixIndex()
    assert index.add(("a", "dram"), [], SIZES) == 0
    assert index.holders_of("a") == [] and index.replica_counts() == {}


def test_matches_brute_force_on_random_holdings() -> None:
    rng = random.Random(7)
    index = PrefixIndex()
    held: dict[tuple[str, str], set[bytes]] = {}
    chain = [h(i) for i in range(40)]
    holders = [(f"n{i}", tier) for i in range(30) for tier in ("dram", "nvme", "s3")]
    for _ in range(400):
        holder = rng.choice(holders)
        start, stop = sorted(rng.sample(range(41), 2))
        blocks = chain[start:stop]
        if rng.random() < 0.7:
            index.add(holder, blocks, SIZES)
            held.setdefault(holder, set()).update(blocks)
        else:
            index.remove(holder, blocks)
            held.setdefault(holder, set()).difference_update(blocks)
        if rng.random() < 0.05:
            index.remove_node(holder[0])
            for key in [k for k in held if k[0] == holder[0]]:
                held[key] = set()
        for probe in (chain, chain[rng.randrange(40) :]):
            assert index.match(probe) == brute_force(held, probe)
            for tiers in (("dram",), ("nvme", "s3"), ("dram", "nvme"), ("dram", "nvme", "s3")):
                assert index.match(probe, tiers) == brute_force(held, probe, tiers)
    assert index.num_replicas == sum(len(b) for b in held.values())
    assert index.replica_bytes == sum(SIZES[x] for b in held.values() for x in b)
    assert len(index) == len(set().union(*held.values()))
