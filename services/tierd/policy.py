"""Which blocks a tier evicts, and whether a block is worth admitting: pure functions of the
blocks' metadata (no I/O, no framework), shared with the simulator.

Invariant (prefix awareness): a victim never has a child (a block whose parent it is) that is
present and not chosen before it, so chains are always cut from the tail and a held block's
whole prefix stays held. Every policy ranks the blocks it may evict by a key, lowest first,
and ties go to the deeper block, then to the lower hash, so every order is deterministic.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

Rank = tuple[float, ...]


@dataclass(slots=True)
class BlockInfo:
    """What a policy knows of one block held in a tier."""

    block_hash: bytes
    parent_hash: bytes
    num_bytes: int
    depth: int  # blocks before it in its chain (0: the chain's first block)
    created_at: float
    last_access: float
    access_count: int
    quota_key: bytes = b""


class EvictionPolicy(Protocol):
    name: str

    def victims(
        self,
        blocks: Mapping[bytes, BlockInfo],
        need_bytes: int,
        now: float,
        *,
        quota_key: bytes | None = None,
    ) -> list[bytes]:
        """Hashes to evict, in order, freeing at least ``need_bytes`` (fewer if there are not
        enough), only among blocks of ``quota_key`` when given; see the module invariant."""
        ...


def tail_first_victims(
    blocks: Mapping[bytes, BlockInfo],
    need_bytes: int,
    rank: Callable[[BlockInfo], Rank],
    quota_key: bytes | None = None,
) -> list[bytes]:
    """The lowest-ranked evictable blocks until ``need_bytes`` are freed: a heap over the
    blocks with no child left, to which a parent joins once its last child is chosen."""
    if need_bytes <= 0:
        return []
    children: dict[bytes, int] = {}
    for block_hash, info in blocks.items():
        parent = info.parent_hash
        if parent in blocks and parent != block_hash:
            children[parent] = children.get(parent, 0) + 1

    def entry(block_hash: bytes, info: BlockInfo) -> tuple[Rank, float, bytes]:
        return rank(info), -info.depth, block_hash

    def eligible(info: BlockInfo) -> bool:
        return quota_key is None or info.quota_key == quota_key

    heap = [entry(h, i) for h, i in blocks.items() if h not in children and eligible(i)]
    heapq.heapify(heap)
    chosen: list[bytes] = []
    freed = 0
    while heap and freed < need_bytes:
        _, _, block_hash = heapq.heappop(heap)
        info = blocks[block_hash]
        chosen.append(block_hash)
        freed += info.num_bytes
        parent = info.parent_hash
        if parent in children:
            children[parent] -= 1
            if children[parent] == 0 and eligible(blocks[parent]):
                heapq.heappush(heap, entry(parent, blocks[parent]))
    return chosen


class _RankedPolicy:
    """A policy given by a rank per block (lower is evicted first)."""

    name: str

    def rank(self, info: BlockInfo, now: float) -> Rank:
        raise NotImplementedError

    def victims(
        self,
        blocks: Mapping[bytes, BlockInfo],
        need_bytes: int,
        now: float,
        *,
        quota_key: bytes | None = None,
    ) -> list[bytes]:
        return tail_first_victims(blocks, need_bytes, lambda i: self.rank(i, now), quota_key)


class LruPolicy(_RankedPolicy):
    """Least recently used first."""

    name = "lru"

    def rank(self, info: BlockInfo, now: float) -> Rank:
        return (info.last_access,)


class LfuPolicy(_RankedPolicy):
    """Least frequently used first; among equally used, least recently used."""

    name = "lfu"

    def rank(self, info: BlockInfo, now: float) -> Rank:
        return (float(info.access_count), info.last_access)


@dataclass(frozen=True, slots=True)
class RecomputeModel:
    """Seconds to recompute one block at ``depth``, with the scheduler's prefill model for
    ``n = block_size`` tokens after ``context = depth · block_size`` cached ones:
    ``base + per_token · n + per_attention · n · (context + n / 2)``. The defaults are the
    scheduler's prior for this CPU, less the per-step base: a recomputed block is one part of a
    prefill chunk, whose base it shares."""

    block_size: int = 32
    base_s: float = 0.0
    per_token_s: float = 2e-3
    per_attention_s: float = 1.7e-6

    def seconds(self, depth: int) -> float:
        n = self.block_size
        context = max(depth, 0) * n
        return self.base_s + self.per_token_s * n + self.per_attention_s * n * (context + n / 2)

    def seconds_per_byte(self, info: BlockInfo) -> float:
        return self.seconds(info.depth) / max(info.num_bytes, 1)


class RecomputeAwarePolicy(_RankedPolicy):
    """Cheapest to recompute per byte first (shallow blocks: little context); among equals,
    least recently used."""

    name = "recompute"

    def __init__(self, **model: Any) -> None:
        self.model = RecomputeModel(**model)

    def rank(self, info: BlockInfo, now: float) -> Rank:
        return (self.model.seconds_per_byte(info), info.last_access)


class CrescentPolicy(_RankedPolicy):
    """Lowest expected value per byte first: (probability of reuse) × (recompute seconds it
    saves) / bytes. The reuse probability maps an exponentially decayed access frequency
    ``f = (access_count + prior_accesses) · 2^(−age / half_life_s)``, with ``age`` the time
    since the last access, onto ``f / (1 + f)``; the prior keeps a block just stored and never
    read from counting as worthless. Among equals, least recently used."""

    name = "crescent"

    def __init__(
        self, half_life_s: float = 600.0, prior_accesses: float = 1.0, **model: Any
    ) -> None:
        if half_life_s <= 0:
            raise ValueError(f"half_life_s must be positive, got {half_life_s}")
        self.half_life_s = half_life_s
        self.prior_accesses = prior_accesses
        self.model = RecomputeModel(**model)

    def reuse_probability(self, info: BlockInfo, now: float) -> float:
        age = max(now - info.last_access, 0.0)
        freq = (info.access_count + self.prior_accesses) * math.exp2(-age / self.half_life_s)
        return freq / (1.0 + freq)

    def value(self, info: BlockInfo, now: float) -> float:
        return self.reuse_probability(info, now) * self.model.seconds_per_byte(info)

    def rank(self, info: BlockInfo, now: float) -> Rank:
        return (self.value(info, now), info.last_access)


POLICIES: dict[str, Callable[..., _RankedPolicy]] = {
    "lru": LruPolicy,
    "lfu": LfuPolicy,
    "recompute": RecomputeAwarePolicy,
    "crescent": CrescentPolicy,
}


def make_policy(name: str, **params: Any) -> EvictionPolicy:
    """The policy called ``name`` (``lru``, ``lfu``, ``recompute``, ``crescent``) built with
    ``params``; ValueError for another name, TypeError for a parameter it does not take."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown eviction policy {name!r}; one of {sorted(POLICIES)}") from None
    return factory(**params)


def admits(
    policy: _RankedPolicy, candidate: BlockInfo, displaced: Iterable[BlockInfo], now: float
) -> bool:
    """Admission: a block is worth storing when the policy ranks it above every block it
    would displace (nothing displaced: always). Keeps a cold block from pushing out hot ones."""
    mine = policy.rank(candidate, now)
    return all(policy.rank(other, now) < mine for other in displaced)


def chain_depths(parents: Mapping[bytes, bytes]) -> dict[bytes, int]:
    """The depth of each block of ``parents`` (hash → parent hash) counted within the mapping:
    exact when a chain's whole prefix is present, a lower bound where it is cut off."""
    depths: dict[bytes, int] = {}
    for start in parents:
        path: list[bytes] = []
        node = start
        while node in parents and node not in depths and len(path) <= len(parents):
            path.append(node)
            node = parents[node]
        base = depths.get(node, -1)
        for offset, block_hash in enumerate(reversed(path), start=1):
            depths[block_hash] = base + offset
    return depths
