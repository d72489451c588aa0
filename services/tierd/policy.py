"""Which blocks a tier evicts, and whether a block is worth admitting: pure functions of the
blocks' metadata (no I/O, no framework), shared with the simulator.

Invariant (prefix awareness): a victim never has a child (a block whose parent it is) that is
present and not chosen before it, so chains are always cut from the tail and a held block's
whole prefix stays held. Every policy ranks the blocks it may evict by a key, lowest first,
and ties go to the deeper block, then to the lower hash, so every order is deterministic.

Every rank here is a function of a block's metadata alone, not of the clock: two blocks keep
their order until one of them is read. That is what lets ``victim_index`` keep a policy's order
incrementally (one heap update per read) instead of re-sorting every block per eviction.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from services.tierd.victim_index import BlockInfo, Rank, VictimIndex, tail_first_victims

__all__ = [
    "POLICIES",
    "AccessHistory",
    "BlockInfo",
    "CrescentPolicy",
    "EvictionPolicy",
    "LfuPolicy",
    "LruPolicy",
    "Rank",
    "RecomputeAwarePolicy",
    "RecomputeModel",
    "VictimIndex",
    "admits",
    "chain_depths",
    "make_policy",
    "tail_first_victims",
    "victim_index",
]


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


class _RankedPolicy:
    """A policy given by a rank per block (lower is evicted first)."""

    name: str
    #: Whether a block's rank is fixed between its reads (see the module docstring).
    time_invariant: ClassVar[bool] = True

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
    """Lowest expected recompute time saved per byte first.

    A block's reuse is estimated by an exponentially decayed access frequency,
    ``f = (access_count + prior_accesses) · 2^(−age / half_life_s)`` with ``age`` the time since
    its last access: recency and frequency in one number, where each read is worth a fresh
    block's whole prior and ``half_life_s`` sets how long past reads keep protecting it. A hit
    on a block saves recomputing it, ``RecomputeModel.seconds(depth)`` (deeper blocks attend to
    more context); the value per byte is ``f · seconds^cost_weight / num_bytes``.

    ``cost_weight`` below 1 damps the premium of depth: a block's hit needs its whole prefix held
    too, and a deep block's own count says nothing of that, so full weight keeps long chains at
    the expense of many more shallow hits. 0 ranks by reuse alone.

    The rank is ``log2`` of the value at time 0: every block's value halves each
    ``half_life_s``, so the order at any later time is the same and needs no clock. Among
    equals, least recently used.
    """

    name = "crescent"

    def __init__(
        self,
        half_life_s: float = 300.0,
        prior_accesses: float = 1.0,
        cost_weight: float = 0.25,
        **model: Any,
    ) -> None:
        if half_life_s <= 0:
            raise ValueError(f"half_life_s must be positive, got {half_life_s}")
        if prior_accesses <= 0:
            raise ValueError(f"prior_accesses must be positive, got {prior_accesses}")
        self.half_life_s = half_life_s
        self.prior_accesses = prior_accesses
        self.cost_weight = cost_weight
        self.model = RecomputeModel(**model)

    def frequency(self, info: BlockInfo, now: float) -> float:
        age = max(now - info.last_access, 0.0)
        return (info.access_count + self.prior_accesses) * math.exp2(-age / self.half_life_s)

    def value(self, info: BlockInfo, now: float) -> float:
        saved = self.model.seconds(info.depth) ** self.cost_weight
        return self.frequency(info, now) * saved / max(info.num_bytes, 1)

    def rank(self, info: BlockInfo, now: float) -> Rank:
        log_value = (
            math.log2(info.access_count + self.prior_accesses)
            + info.last_access / self.half_life_s
            + self.cost_weight * math.log2(max(self.model.seconds(info.depth), 1e-12))
            - math.log2(max(info.num_bytes, 1))
        )
        return (log_value, info.last_access)


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


def victim_index(policy: EvictionPolicy) -> VictimIndex:
    """An empty incremental index of ``policy``'s victims, for a tier that adds, reads and drops
    blocks one at a time: its order is the one ``policy.victims`` would give (without a quota).
    ValueError for a policy whose order moves with the clock alone, or that has no rank."""
    rank = getattr(policy, "rank", None)
    if rank is None or not getattr(policy, "time_invariant", False):
        raise ValueError(f"policy {policy.name!r} has no clock-free rank to index")
    return VictimIndex(lambda info: rank(info, info.last_access))


class AccessHistory:
    """Remembers how often the tier's most recently dropped blocks had been used, so a block
    that comes back counts as reused rather than new (the ghost entries of 2Q and ARC).

    Invariant: at most ``capacity`` blocks are remembered (None: no limit, 0: none); when full,
    the block dropped longest ago is forgotten first.
    """

    def __init__(self, capacity: int | None) -> None:
        if capacity is not None and capacity < 0:
            raise ValueError(f"capacity must be non-negative, got {capacity}")
        self.capacity = capacity
        self._counts: OrderedDict[bytes, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._counts)

    def remember(self, block_hash: bytes, access_count: int) -> None:
        if self.capacity == 0:
            return
        self._counts[block_hash] = access_count
        self._counts.move_to_end(block_hash)
        if self.capacity is not None and len(self._counts) > self.capacity:
            self._counts.popitem(last=False)

    def recall(self, block_hash: bytes) -> int | None:
        """The dropped block's access count, forgotten as it is recalled; None if unknown."""
        return self._counts.pop(block_hash, None)
