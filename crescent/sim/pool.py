"""A simulated global KV pool: which blocks of a trace are held, evicting by one of tierd's own
policies (``services.tierd.policy``) through its incremental victim index.

Hash ids are ints, as in Mooncake traces; within a request the parent of ``hash_ids[i]`` is
``hash_ids[i - 1]``. A request's hits are its leading ids already held (a prefix cache stops at
the first miss); then every id of the request is read or stored, and blocks are evicted until
the pool is back within its capacity. Evicting after the whole request, not block by block,
gives the same victims whenever a request fits the pool, and lets a policy turn away a new
chain's tail (it is evicted first when it ranks lowest) without cutting into its head.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from services.tierd.policy import (
    AccessHistory,
    BlockInfo,
    EvictionPolicy,
    make_policy,
    victim_index,
)

ROOT = b"\xff" * 9  # the parent of a chain's first block: no 8-byte block hash equals it
#: Seconds between the access times of consecutive blocks, so that each block of a request has
#: its own time and recency is a strict order even for requests with equal timestamps.
TICK_S = 1e-6
#: Evicted blocks whose use is remembered, per block of capacity (see ``AccessHistory``).
HISTORY_PER_BLOCK = 4


def block_key(hash_id: int) -> bytes:
    """A trace hash id as a tier's block hash (8 bytes, big-endian: the order of the ints)."""
    return hash_id.to_bytes(8, "big")


class PrefixCache(Protocol):
    """What the cluster simulator needs of a pool: ``BlockPool`` or ``belady.OptimalPool``."""

    hits: int
    requested: int

    def lookup(self, hash_ids: Sequence[int]) -> int: ...

    def access(self, hash_ids: Sequence[int], now: float) -> int: ...

    def __contains__(self, hash_id: object) -> bool: ...

    def __len__(self) -> int: ...


class HitCounters:
    """Blocks requested and found as a cached prefix, over every request served so far."""

    def __init__(self) -> None:
        self.hits = 0
        self.requested = 0
        self.evictions = 0

    @property
    def hit_rate(self) -> float:
        """Blocks found as a cached prefix ÷ blocks requested (0 before any request)."""
        return self.hits / self.requested if self.requested else 0.0

    def _count(self, hits: int, requested: int) -> None:
        self.hits += hits
        self.requested += requested


class BlockPool(HitCounters):
    """Owns the set of blocks a pool of ``capacity_blocks`` uniform blocks holds (None: no
    limit), their use, and the hit counters.

    Invariants: after each ``access`` at most ``capacity_blocks`` blocks are held; a held
    block's parent is held (victims are cut from chain tails), so a request's leading hits are
    all its held blocks; ``hits <= requested``. A block's ``access_count`` counts its reads
    after the first, including those before an eviction the pool still remembers.
    """

    def __init__(
        self,
        capacity_blocks: int | None,
        policy: EvictionPolicy | str = "lru",
        *,
        block_bytes: int = 1,
        history_blocks: int | None = None,
    ) -> None:
        if capacity_blocks is not None and capacity_blocks < 0:
            raise ValueError(f"capacity_blocks must be non-negative, got {capacity_blocks}")
        if block_bytes <= 0:
            raise ValueError(f"block_bytes must be positive, got {block_bytes}")
        self.capacity_blocks = capacity_blocks
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        self.block_bytes = block_bytes
        self._index = victim_index(self.policy)
        if history_blocks is None and capacity_blocks is not None:
            history_blocks = HISTORY_PER_BLOCK * capacity_blocks
        self._history = AccessHistory(history_blocks)
        # A learning policy (crescent) is told of every store and read, and its ranks are
        # redone when what it learned changes them.
        self._observe: Callable[[int], None] | None = getattr(self.policy, "observe", None)
        self._rank_version = self._policy_rank_version()
        self._clock = float("-inf")
        super().__init__()

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, hash_id: object) -> bool:
        return isinstance(hash_id, int) and block_key(hash_id) in self._index

    @property
    def held_bytes(self) -> int:
        return len(self._index) * self.block_bytes

    @property
    def infos(self) -> Mapping[bytes, BlockInfo]:
        """What the policy sees of each held block (keys: ``block_key`` of the hash id)."""
        return self._index.blocks

    def next_victim(self) -> int | None:
        """The hash id the pool would evict next, if any."""
        victim = self._index.peek()
        return None if victim is None else int.from_bytes(victim.block_hash, "big")

    def lookup(self, hash_ids: Sequence[int]) -> int:
        """How many leading blocks of ``hash_ids`` are held; changes nothing."""
        index = self._index
        found = 0
        for hash_id in hash_ids:
            if block_key(hash_id) not in index:
                break
            found += 1
        return found

    def access(self, hash_ids: Sequence[int], now: float) -> int:
        """Serves one request at ``now`` (seconds): counts its leading hits, reads or stores
        every block, evicts down to capacity; returns the leading hits."""
        hits = self.lookup(hash_ids)
        self._count(hits, len(hash_ids))
        parent = ROOT
        for depth, hash_id in enumerate(hash_ids):
            self._clock = stamp = max(now, self._clock + TICK_S)
            key = block_key(hash_id)
            self._touch(key, parent, depth, stamp)
            parent = key
        version = self._policy_rank_version()
        if version != self._rank_version:
            self._rank_version = version
            self._index.rerank()
        self._evict()
        return hits

    def _policy_rank_version(self) -> int:
        return int(getattr(self.policy, "rank_version", 0))

    def _touch(self, key: bytes, parent: bytes, depth: int, stamp: float) -> None:
        index = self._index
        info = index.get(key)
        if info is not None:
            info.last_access = stamp
            info.access_count += 1
            count = info.access_count
            index.update(key)
        else:
            seen = self._history.recall(key)
            count = 0 if seen is None else seen + 1
            index.add(BlockInfo(key, parent, self.block_bytes, depth, stamp, stamp, count))
        if self._observe is not None:
            self._observe(count)

    def _evict(self) -> None:
        capacity = self.capacity_blocks
        if capacity is None:
            return
        index = self._index
        while len(index) > capacity:
            victim = index.pop()
            if victim is None:  # unreachable: a forest always has a leaf
                break
            self._history.remember(victim.block_hash, victim.access_count)
            self.evictions += 1
