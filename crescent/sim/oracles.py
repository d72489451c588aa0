"""Two offline references between the optimum (``belady``) and online policies, each a pool
that knows part of what is to come.

``ReturnOraclePool`` is told *whether* each block will be asked for again, but not *when*:
how much of the gap to the optimum is knowing which blocks come back, and how much knowing
how soon. ``ClassAgeOraclePool`` knows, for each read count, the exact distribution of the
time until a block read that often is asked for again, but nothing of any one block: what a
policy ranking by read count and age (LHD, LRU-K, tierd's ``crescent``) could find, had it
learned perfectly. Both evict through tierd's victim index, chains cut from the tail.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict
from collections.abc import Sequence

from crescent.sim.belady import NEVER, next_position, next_uses
from crescent.sim.pool import BlockPool, HitCounters, block_key
from services.tierd.policy import BlockInfo, Rank, RankedPolicy


class ReturnRanks(RankedPolicy):
    """A rank for tierd's victim index from a glimpse of the future: blocks never asked for
    again go first, then least recently used. Owns ``returns``: for each block key, whether a
    request after the block's last access asks for it (kept current by ``ReturnOraclePool``)."""

    name = "oracle-returns"

    def __init__(self) -> None:
        self.returns: dict[bytes, bool] = {}

    def rank(self, info: BlockInfo, now: float) -> Rank:
        return (1.0 if self.returns[info.block_hash] else 0.0, info.last_access)


class _ForeseeingPool(HitCounters):
    """Owns a ``BlockPool`` serving ``requests`` in the order given, evicting by ``ranks``,
    which ``_foresee`` tells what it may know of what is to come before each request is
    served. The counters are the pool's own."""

    def __init__(
        self, requests: Sequence[Sequence[int]], ranks: RankedPolicy, capacity: int | None
    ) -> None:
        self._requests = [tuple(ids) for ids in requests]
        self._pool = BlockPool(capacity, ranks, defer=False)
        self._position = 0
        super().__init__()

    def __len__(self) -> int:
        return len(self._pool)

    def __contains__(self, hash_id: object) -> bool:
        return hash_id in self._pool

    def lookup(self, hash_ids: Sequence[int]) -> int:
        return self._pool.lookup(hash_ids)

    def access(self, hash_ids: Sequence[int], now: float) -> int:
        """Serves the next request (ValueError if it is not the next one given)."""
        position = self._position
        self._position = next_position(self._requests, position, hash_ids)
        self._foresee(position, hash_ids, now)
        hits = self._pool.access(hash_ids, now)
        self._count(hits, len(hash_ids))
        self.evictions = self._pool.evictions
        return hits

    def _foresee(self, position: int, hash_ids: Sequence[int], now: float) -> None:
        raise NotImplementedError


class ReturnOraclePool(_ForeseeingPool):
    """Evicts by ``ReturnRanks``: knows whether each block is asked for again, not when.

    Invariant: before a request is served, ``ReturnRanks.returns`` holds, for each of its
    blocks, whether a later request asks for it."""

    def __init__(self, requests: Sequence[Sequence[int]], capacity_blocks: int | None) -> None:
        self._ranks = ReturnRanks()
        super().__init__(requests, self._ranks, capacity_blocks)
        self._next = next_uses(self._requests)

    def _foresee(self, position: int, hash_ids: Sequence[int], now: float) -> None:
        returns = self._ranks.returns
        for hash_id, next_use in zip(hash_ids, self._next[position], strict=True):
            returns[block_key(hash_id)] = next_use != NEVER


#: Lower edges of the age bins (seconds) of ``ClassAgeRanks``: four a doubling, to about 4.5 h.
AGE_BINS = [0.0] + [2 ** (b / 4) - 1 for b in range(1, 57)]


def hit_density(gaps: Sequence[float]) -> list[float]:
    """For each age bin: the most hits per second of holding that a block of age a (not asked
    for since) can give, over any further holding time x from the bins, given ``gaps``, the
    times until blocks of its class were next asked for (``math.inf``: never). A block held
    until it is asked for or x runs out costs, per block of age a, min(gap, a + x) - a."""
    finite = sorted(g for g in gaps if g < math.inf)
    total = len(gaps)
    cumulative = [0.0]
    for gap in finite:
        cumulative.append(cumulative[-1] + gap)
    out: list[float] = []
    for age in AGE_BINS:
        past = bisect.bisect_right(finite, age)
        alive = total - past
        best = 0.0
        for x in AGE_BINS[1:]:
            until = bisect.bisect_right(finite, age + x)
            hits = until - past
            held = cumulative[until] - cumulative[past] - age * hits + x * (alive - hits)
            if held > 0:
                best = max(best, hits / held)
        out.append(best)
    return out


class ClassAgeRanks(RankedPolicy):
    """LHD's rank (Beckmann et al., NSDI 2018: least hit density first) from perfect
    statistics: a block's rank is the hit density of its read-count class at its age now.
    Owns ``density`` (class -> density by age bin), ``classes`` (block key -> class, kept
    current by ``ClassAgeOraclePool``) and ``now``; ranks move with ``now``, so the pool
    redoes them whenever ``rank_version`` changes."""

    name = "oracle-class-age"

    def __init__(self, density: dict[int, list[float]]) -> None:
        self.density = density
        self.classes: dict[bytes, int] = {}
        self.now = 0.0
        self.rank_version = 0

    def rank(self, info: BlockInfo, now: float) -> Rank:
        age = max(self.now - info.last_access, 0.0)
        age_bin = bisect.bisect_right(AGE_BINS, age) - 1
        return (self.density[self.classes[info.block_hash]][age_bin], info.last_access)


class ClassAgeOraclePool(_ForeseeingPool):
    """Evicts by ``ClassAgeRanks``, whose classes are the times a block was asked for before
    (at most ``top``) and whose densities come from every request to come (at ``times_s``).
    Ranks are redone every ``rerank_every`` requests, at that request's time.

    Invariant: before a request is served, each of its blocks has the class it enters with
    this request, and ``ClassAgeRanks.now`` is the request's time."""

    def __init__(
        self,
        requests: Sequence[Sequence[int]],
        times_s: Sequence[float],
        capacity_blocks: int | None,
        *,
        top: int = 16,
        rerank_every: int = 10,
    ) -> None:
        self._classes, gaps = _classes_and_gaps(requests, times_s, top)
        self._ranks = ClassAgeRanks({c: hit_density(g) for c, g in gaps.items()})
        super().__init__(requests, self._ranks, capacity_blocks)
        self._rerank_every = rerank_every

    def _foresee(self, position: int, hash_ids: Sequence[int], now: float) -> None:
        ranks = self._ranks
        ranks.now = now
        if position % self._rerank_every == 0:
            ranks.rank_version += 1
        for hash_id, block_class in zip(hash_ids, self._classes[position], strict=True):
            ranks.classes[block_key(hash_id)] = block_class


def _classes_and_gaps(
    requests: Sequence[Sequence[int]], times_s: Sequence[float], top: int
) -> tuple[list[list[int]], dict[int, list[float]]]:
    """Each request's blocks' classes (times asked for before, at most ``top``), and for each
    class the times until its blocks were next asked for (``math.inf``: never)."""
    asked: Counter[int] = Counter()
    classes: list[list[int]] = []
    for ids in requests:
        classes.append([min(asked[h], top) for h in ids])
        asked.update(ids)
    gaps: defaultdict[int, list[float]] = defaultdict(list)
    upcoming: dict[int, float] = {}
    for position in range(len(requests) - 1, -1, -1):
        t = times_s[position]
        for hash_id, block_class in zip(requests[position], classes[position], strict=True):
            gaps[block_class].append(upcoming.get(hash_id, math.inf) - t)
        for hash_id in requests[position]:
            upcoming[hash_id] = t
    return classes, dict(gaps)
