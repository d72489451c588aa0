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

from collections.abc import Callable, Collection, Mapping, Sequence
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

    Until a pool first fills, nothing is evicted, so nothing needs the policy's order: the
    accesses are logged with the keys they leave held (``_held``), and replayed in order
    through the policy's index when the pool would first overflow or its order is first read,
    which leaves it as if every access had gone through the index (most pools of a large
    cluster never fill). A policy that learns from the accesses (``observe``) and may be
    shared with other pools sees them as they come instead, and so does every access with
    ``defer=False``.
    """

    def __init__(
        self,
        capacity_blocks: int | None,
        policy: EvictionPolicy | str = "lru",
        *,
        block_bytes: int = 1,
        history_blocks: int | None = None,
        defer: bool = True,
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
        defer = defer and (isinstance(policy, str) or self._observe is None)
        self._log: list[tuple[Sequence[bytes], float]] | None = [] if defer else None
        self._held: set[bytes] = set()
        self._holding: Collection[bytes] = self._held if defer else self._index.blocks
        super().__init__()

    def __len__(self) -> int:
        return len(self._holding)

    def __contains__(self, hash_id: object) -> bool:
        return isinstance(hash_id, int) and block_key(hash_id) in self._holding

    def holds_key(self, key: bytes) -> bool:
        """Whether the block of ``block_key`` ``key`` is held."""
        return key in self._holding

    @property
    def held_bytes(self) -> int:
        return len(self._holding) * self.block_bytes

    @property
    def infos(self) -> Mapping[bytes, BlockInfo]:
        """What the policy sees of each held block (keys: ``block_key`` of the hash id)."""
        self._replay()
        return self._index.blocks

    def next_victim(self) -> int | None:
        """The hash id the pool would evict next, if any."""
        self._replay()
        victim = self._index.peek()
        return None if victim is None else int.from_bytes(victim.block_hash, "big")

    def lookup(self, hash_ids: Sequence[int]) -> int:
        """How many leading blocks of ``hash_ids`` are held; changes nothing."""
        holding = self._holding
        found = 0
        for hash_id in hash_ids:
            if block_key(hash_id) not in holding:
                break
            found += 1
        return found

    def lookup_keys(self, keys: Sequence[bytes]) -> int:
        """``lookup`` of the hash ids whose ``block_key`` are ``keys``."""
        holding = self._holding
        found = 0
        for key in keys:
            if key not in holding:
                break
            found += 1
        return found

    def access(self, hash_ids: Sequence[int], now: float) -> int:
        """Serves one request at ``now`` (seconds): counts its leading hits, reads or stores
        every block, evicts down to capacity; returns the leading hits."""
        return self.access_keys([block_key(hash_id) for hash_id in hash_ids], now)

    def access_keys(self, keys: Sequence[bytes], now: float) -> int:
        """``access`` of the hash ids whose ``block_key`` are ``keys``."""
        hits = self.lookup_keys(keys)
        self._count(hits, len(keys))
        if self._log is not None and self._log_access(keys, now):
            return hits
        self._serve(keys, now)
        return hits

    def _log_access(self, keys: Sequence[bytes], now: float) -> bool:
        """Logs the access if it leaves the pool within capacity (False: it is replayed, and
        the access must be served)."""
        held = self._held
        held.update(keys)
        capacity = self.capacity_blocks
        if capacity is not None and len(held) > capacity:
            self._replay()
            return False
        assert self._log is not None
        self._log.append((keys, now))
        return True

    def _replay(self) -> None:
        """Hands the blocks of the logged accesses to the policy's index, as ``_serve``
        would have left them (nothing was evicted, nothing is remembered), and serves every
        access after through it."""
        log, self._log = self._log, None
        if log is None:
            return
        self._holding = self._index.blocks
        self._held = set()
        infos: dict[bytes, BlockInfo] = {}
        observe, block_bytes, clock = self._observe, self.block_bytes, self._clock
        for keys, now in log:
            if not keys:
                continue
            stamp = max(now, clock + TICK_S)  # as in ``_serve``
            parent = ROOT
            for depth, key in enumerate(keys):
                if depth:
                    stamp += TICK_S
                info = infos.get(key)
                if info is not None:
                    info.last_access = stamp
                    info.access_count += 1
                    count = info.access_count
                else:
                    count = 0
                    infos[key] = BlockInfo(key, parent, block_bytes, depth, stamp, stamp, 0)
                if observe is not None:
                    observe(count)
                parent = key
            clock = stamp
        self._clock = clock
        self._index.add_all(infos.values())
        self._rank_version = self._policy_rank_version()

    def _serve(self, keys: Sequence[bytes], now: float) -> None:
        """Reads or stores every block of ``keys`` in the index, then evicts to capacity."""
        if not keys:
            return
        index = self._index
        # Each block gets its own time, TICK_S after the one before (the first no earlier
        # than ``now``): recency is a strict order.
        stamp = max(now, self._clock + TICK_S)
        get, observe = index.blocks.get, self._observe
        recall, block_bytes = self._history.recall, self.block_bytes
        parent = ROOT
        for depth, key in enumerate(keys):
            if depth:
                stamp += TICK_S
            info = get(key)
            if info is not None:
                info.last_access = stamp
                info.access_count += 1
                count = info.access_count
                index.update(key)
            else:
                seen = recall(key)
                count = 0 if seen is None else seen + 1
                index.add(BlockInfo(key, parent, block_bytes, depth, stamp, stamp, count))
            if observe is not None:
                observe(count)
            parent = key
        self._clock = stamp
        version = self._policy_rank_version()
        if version != self._rank_version:
            self._rank_version = version
            index.rerank()
        self._evict()

    def _policy_rank_version(self) -> int:
        return int(getattr(self.policy, "rank_version", 0))

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
