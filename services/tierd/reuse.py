"""What a tier learns of how its blocks are reused: the use of blocks it dropped (so one that
comes back is known), and how likely a block read k times is to be read again. Pure
bookkeeping (no I/O, no framework), for the eviction policies and the simulator.
"""

from __future__ import annotations

from collections import OrderedDict

#: Dropped blocks a tier remembers per block it holds (see ``AccessHistory``). Most of what
#: ``crescent`` finds beyond LRU comes from this memory, and a longer one finds less: a block
#: back after that long is no likelier to come back again (docs/benchmarks.md, "Cache
#: policies in the simulator").
HISTORY_PER_BLOCK = 4


class AccessHistory:
    """Remembers how often the tier's most recently dropped blocks had been used, so a block
    that comes back counts as reused rather than new (the ghost entries of 2Q and ARC).

    Invariant: at most ``capacity`` blocks are remembered (None: no limit, 0: none); when full,
    the block dropped longest ago is forgotten first. ``capacity`` may be changed at any
    time; the memory is trimmed to it on the next ``remember``.
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
            self._counts.clear()
            return
        self._counts[block_hash] = access_count
        self._counts.move_to_end(block_hash)
        if self.capacity is not None:
            while len(self._counts) > self.capacity:
                self._counts.popitem(last=False)

    def peek(self, block_hash: bytes) -> int | None:
        """The dropped block's access count, still remembered; None if unknown."""
        return self._counts.get(block_hash)

    def recall(self, block_hash: bytes) -> int | None:
        """The dropped block's access count, forgotten as it is recalled; None if unknown."""
        return self._counts.pop(block_hash, None)


#: The chance of reuse assumed for a block never read, before anything is learned.
EVEN_CHANCE = 0.5


class ReuseStatistics:
    """Learns, for each read count k, the chance that a block read k times is read again: of
    the blocks that reached k reads, the share that went on to k + 1 (counts of counts). The
    last class, ``top``, pools every block read ``top`` times or more.

    Invariants: ``reached[k]`` is the (decayed) number of times a block's count became exactly
    k, for k <= ``top``, and ``reached[top + 1]`` the number of times it became more than
    ``top``. Each estimate is pulled toward the one below it by ``smoothing``
    pseudo-observations (see ``table``). Each time ``memory`` observations accumulate,
    all counts halve: old behaviour fades.
    """

    def __init__(self, top: int = 16, smoothing: float = 20.0, memory: float = 1e6) -> None:
        if top < 1 or smoothing <= 0 or memory <= 0:
            raise ValueError("top must be at least 1, smoothing and memory positive")
        self.top = top
        self.smoothing = smoothing
        self.memory = memory
        self.reached = [0.0] * (top + 2)
        self.observed = 0.0

    def observe(self, access_count: int) -> None:
        """A block was stored (count 0) or read, and its count is now ``access_count``."""
        self.reached[min(access_count, self.top + 1)] += 1.0
        self.observed += 1.0
        if self.observed >= self.memory:
            self.reached = [r / 2 for r in self.reached]
            self.observed /= 2

    def probability(self, reads: int) -> float:
        """The estimated chance that a block read ``reads`` times is read again."""
        return self.table()[min(reads, self.top)]

    def table(self) -> list[float]:
        """The estimate for each read count 0..top. Each class is pulled toward the estimate of
        the class below it (the first toward an even chance): a class seldom seen is taken to
        behave like its neighbour until its own reads say otherwise, and with nothing learned
        every class is alike (frequency then counts for nothing)."""
        reached = self.reached
        out: list[float] = []
        prior = EVEN_CHANCE
        for k in range(self.top + 1):
            if k < self.top:
                exposed, went_on = reached[k], reached[k + 1]
            else:
                went_on = reached[k + 1]
                exposed = reached[k] + went_on
            # Blocks first met mid-life (remembered counts, a restart) can make a class look
            # reached more often than the one before it.
            went_on = min(went_on, exposed)
            prior = (went_on + self.smoothing * prior) / (exposed + self.smoothing)
            out.append(prior)
        return out
