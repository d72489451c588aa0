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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from services.tierd.reuse import AccessHistory, ReuseStatistics
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
    "RankedPolicy",
    "RecomputeAwarePolicy",
    "RecomputeModel",
    "ReuseStatistics",
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


class RankedPolicy:
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


class LruPolicy(RankedPolicy):
    """Least recently used first."""

    name = "lru"

    def rank(self, info: BlockInfo, now: float) -> Rank:
        return (info.last_access,)


class LfuPolicy(RankedPolicy):
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


class RecomputeAwarePolicy(RankedPolicy):
    """Cheapest to recompute per byte first (shallow blocks: little context); among equals,
    least recently used."""

    name = "recompute"

    def __init__(self, **model: Any) -> None:
        self.model = RecomputeModel(**model)

    def rank(self, info: BlockInfo, now: float) -> Rank:
        return (self.model.seconds_per_byte(info), info.last_access)


class CrescentPolicy(RankedPolicy):
    """Lowest expected value per byte first: for a block read k times,

        value = P(read again | k) · 2^(−age / half_life_s) · seconds^cost_weight / num_bytes

    with ``age`` the time since its last access and ``seconds`` what a hit saves, the time to
    recompute the block at its depth (``RecomputeModel``: deeper blocks attend to more context).

    The reuse probability is learned from the tier's own stores and reads (``observe``, see
    ``ReuseStatistics``). The tier remembers the counts of the last few blocks it dropped
    (``reuse.AccessHistory``, ``HISTORY_PER_BLOCK`` per block held), so a block that returns
    is not taken for new: that memory is most of what this policy finds beyond LRU. Until
    anything is learned every count gets an even chance and the order is LRU's. So frequency
    counts for exactly as much as it predicts: where a block read often is no likelier to
    come back (conversations that end at random) the order stays LRU's; where it is (shared
    prompts, popular documents, the conversation trace) blocks read often outlive fresh ones.
    The decay is recency: a block unread for ``half_life_s`` is worth half as much, so a
    probability twice another's buys that long.

    ``cost_weight`` prices depth: 1 weighs a hit by the recompute time it saves, 0 (the
    default) ranks by reuse alone. A deep block's hit needs its whole prefix held too, which
    its own count does not see: on the conversation trace at 10K blocks, a weight of 0.25
    saves 1% more recompute time and finds 3% fewer blocks (docs/benchmarks.md).

    The rank is ``log2`` of the value at time 0. Every value halves each ``half_life_s``, so
    the order at any later time is the same: ranks need no clock, and change for blocks not
    read only when the learned table is refreshed (``rank_version`` counts those changes;
    refreshes come after 1,000 observations, then at doubling intervals up to every 65,536).
    Among equals, least recently used.

    What it cannot see: which new blocks will come back. On the conversation trace a quarter
    do, and every group a tier can tell apart (depth, whether the prompt continues an earlier
    one) returns at 15-31%, except a prompt's last block; knowing only *whether* each block
    returns would find the offline optimum at 10K blocks. Ranking by read count and age with
    perfect statistics of both (LHD's rank, ``crescent.sim.oracles``) finds little more than
    this policy does, so richer counts or an age-shaped value would not close that gap
    (docs/benchmarks.md, "Cache policies in the simulator").
    """

    name = "crescent"
    refresh_first = 1_000
    refresh_most = 65_536
    #: A refreshed table replaces the one in use only if some class moved by more (in bits).
    refresh_tolerance = 0.02

    def __init__(
        self,
        half_life_s: float = 200.0,
        cost_weight: float = 0.0,
        reuse: ReuseStatistics | None = None,
        **model: Any,
    ) -> None:
        if half_life_s <= 0:
            raise ValueError(f"half_life_s must be positive, got {half_life_s}")
        self.half_life_s = half_life_s
        self.cost_weight = cost_weight
        self.model = RecomputeModel(**model)
        self.reuse = reuse if reuse is not None else ReuseStatistics()
        self.rank_version = 0
        self._log_reuse = [math.log2(p) for p in self.reuse.table()]
        self._refresh_every = self.refresh_first
        self._until_refresh = self.refresh_first

    def observe(self, access_count: int) -> None:
        """A block was stored (``access_count`` 0) or read (its count after the read)."""
        self.reuse.observe(access_count)
        self._until_refresh -= 1
        if self._until_refresh > 0:
            return
        self._refresh_every = min(2 * self._refresh_every, self.refresh_most)
        self._until_refresh = self._refresh_every
        table = [math.log2(p) for p in self.reuse.table()]
        moved = max(abs(a - b) for a, b in zip(table, self._log_reuse, strict=True))
        if moved > self.refresh_tolerance:
            self._log_reuse = table
            self.rank_version += 1

    def reuse_probability(self, info: BlockInfo) -> float:
        return math.exp2(self._log_reuse[min(info.access_count, self.reuse.top)])

    def value(self, info: BlockInfo, now: float) -> float:
        age = max(now - info.last_access, 0.0)
        saved = self.model.seconds(info.depth) ** self.cost_weight
        decayed = self.reuse_probability(info) * math.exp2(-age / self.half_life_s)
        return decayed * saved / max(info.num_bytes, 1)

    def rank(self, info: BlockInfo, now: float) -> Rank:
        log_value = (
            self._log_reuse[min(info.access_count, self.reuse.top)]
            + info.last_access / self.half_life_s
            - math.log2(max(info.num_bytes, 1))
        )
        if self.cost_weight:  # skipped when off: the simulator ranks every read
            log_value += self.cost_weight * math.log2(max(self.model.seconds(info.depth), 1e-12))
        return (log_value, info.last_access)


POLICIES: dict[str, Callable[..., RankedPolicy]] = {
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
    policy: RankedPolicy, candidate: BlockInfo, displaced: Iterable[BlockInfo], now: float
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
