"""The incremental victim index against the policies' own one-shot choice."""

from __future__ import annotations

import random

import pytest

from services.tierd.policy import (
    POLICIES,
    BlockInfo,
    VictimIndex,
    make_policy,
    victim_index,
)
from tests.tierd.infos import FOREST, ROOT, block, h, names


def _key(i: int) -> bytes:
    return i.to_bytes(16, "big")


def _random_ops(name: str, seed: int) -> None:
    """Adds, reads and drops on an index and on a plain dict side by side; after each step the
    index's next victim is the one ``victims`` picks from the dict."""
    rng = random.Random(seed)
    policy = make_policy(name)
    index = victim_index(policy)
    held: dict[bytes, BlockInfo] = {}
    clock = 0.0
    for step in range(400):
        clock += rng.random()
        op = rng.random()
        if op < 0.5 or not held:
            parent = rng.choice(list(held)) if held and rng.random() < 0.8 else ROOT
            depth = held[parent].depth + 1 if parent in held else 0
            info = BlockInfo(_key(step), parent, 10, depth, clock, clock, 0)
            held[info.block_hash] = info
            index.add(info)
        elif op < 0.8:
            info = held[rng.choice(list(held))]
            info.last_access = clock
            info.access_count += 1
            index.update(info.block_hash)
        elif op < 0.9:
            victim = index.pop()
            expected = policy.victims(held, 1, now=clock)
            assert victim is not None and [victim.block_hash] == expected
            del held[victim.block_hash]
        else:  # tierd may drop any block (expiry, a lost file), leaf or not
            gone = rng.choice(list(held))
            index.remove(gone)
            del held[gone]
        assert len(index) == len(held)
        peeked = index.peek()
        expected_next = policy.victims(held, 1, now=clock)
        assert ([peeked.block_hash] if peeked else []) == expected_next
    # Draining the index gives the one-shot order in full.
    order = policy.victims(held, 10**9, now=clock)
    drained = []
    while (victim := index.pop()) is not None:
        drained.append(victim.block_hash)
    assert drained == order and len(index) == 0 and index.peek() is None


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_the_index_picks_what_the_policy_picks(name: str) -> None:
    for seed in range(5):
        _random_ops(name, seed)


def test_a_parent_waits_for_its_children_and_returns_after_them() -> None:
    index = VictimIndex(lambda i: (i.last_access,), FOREST)
    assert index.evictable(h("a2")) and not index.evictable(h("a1"))
    assert index.peek() is not None and names([index.peek().block_hash]) == ["b1"]  # type: ignore[union-attr]
    popped = [index.pop() for _ in range(6)]
    assert names([p.block_hash for p in popped if p]) == ["b1", "b0", "c2", "a2", "a1", "a0"]
    assert index.pop() is None
    # A child added before its parent still holds the parent back.
    index.add(block("k1", "k0", depth=1, last=1))
    index.add(block("k0", depth=0, last=0))
    assert not index.evictable(h("k0"))
    with pytest.raises(ValueError, match="already held"):
        index.add(block("k0", depth=0, last=0))
    assert [index.pop().block_hash for _ in range(2)] == [h("k1"), h("k0")]  # type: ignore[union-attr]


def test_stale_entries_are_compacted_away() -> None:
    index = victim_index(make_policy("lru"))
    info = block("x", last=0)
    index.add(info)
    for t in range(1, 5_000):
        info.last_access = float(t)
        index.update(info.block_hash)
    assert len(index._heap) <= 2 * len(index._live) + 1024
    assert len(index._unranked) <= 2 * len(index) + 1024  # reads waiting to be ranked
    assert index.pop() is info and index.pop() is None


def test_only_clock_free_ranks_are_indexed() -> None:
    class Drifting:
        name = "drifting"
        time_invariant = False

        def rank(self, info: BlockInfo, now: float) -> tuple[float, ...]:
            return (now - info.last_access,)

    with pytest.raises(ValueError, match="clock-free"):
        victim_index(Drifting())  # type: ignore[arg-type]
