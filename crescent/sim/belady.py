"""The offline optimum of a KV pool (Belady's MIN): knowing every request to come, evict the
block needed again farthest in the future. No online policy can find more cached prefix blocks,
so it bounds every eviction policy on the same trace and capacity.

Two references between this optimum and online policies are in ``oracles``.

Same rules as ``pool.BlockPool``: a request's hits are its leading held ids; then all its ids
are stored, and the pool evicts down to capacity. A block is never needed before its parent
(whoever asks for it asks for its parent first), so among blocks needed equally late the deeper
goes first and what stays is always a whole prefix: every block held is a hit when next asked
for, and the leading-hit rule costs the optimum nothing.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from crescent.sim.pool import HitCounters

#: The next use of a block never asked for again: later than any request's index.
NEVER = 1 << 62
# Stale heap entries are dropped in one pass once they outnumber the live ones by this much.
_COMPACT_SLACK = 1024


def next_uses(requests: Sequence[Sequence[int]]) -> list[list[int]]:
    """For each request and each of its ids, the index of the next request asking for that id
    (``NEVER`` when none does), from one backward pass."""
    upcoming: dict[int, int] = {}
    out: list[list[int]] = [[] for _ in requests]
    for position in range(len(requests) - 1, -1, -1):
        ids = requests[position]
        out[position] = [upcoming.get(hash_id, NEVER) for hash_id in ids]
        for hash_id in ids:
            upcoming[hash_id] = position
    return out


def next_position(
    requests: Sequence[tuple[int, ...]], position: int, hash_ids: Sequence[int]
) -> int:
    """``position`` + 1 if ``hash_ids`` is the request at ``position``; ValueError if not."""
    if position >= len(requests) or tuple(hash_ids) != requests[position]:
        raise ValueError(f"request {position} is not the one the pool was given in advance")
    return position + 1


class OptimalPool(HitCounters):
    """Owns the blocks Belady's MIN holds while ``requests`` are served in the order given,
    with the pool's interface (``lookup``, ``access``, ``hits``, ``requested``, ``hit_rate``).

    Invariants: at most ``capacity_blocks`` blocks held after each ``access`` (None: no
    limit); ``_held`` maps each held id to the index of its next use, and each held id has one
    live entry ``(-next_use, -depth, id)`` in the heap (others are stale: lazy deletion).
    """

    def __init__(
        self,
        requests: Sequence[Sequence[int]],
        capacity_blocks: int | None,
        *,
        deeper_first: bool = True,
    ) -> None:
        """``deeper_first=False`` breaks ties in next use toward the shallower block instead:
        a worse bound (it may drop a parent whose child the same request needs), kept only to
        show what the tie costs."""
        if capacity_blocks is not None and capacity_blocks < 0:
            raise ValueError(f"capacity_blocks must be non-negative, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self._depth_sign = -1 if deeper_first else 1
        self._requests = [tuple(ids) for ids in requests]
        self._next = next_uses(self._requests)
        self._position = 0
        self._held: dict[int, int] = {}
        self._heap: list[tuple[int, int, int]] = []
        super().__init__()

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, hash_id: object) -> bool:
        return hash_id in self._held

    def lookup(self, hash_ids: Sequence[int]) -> int:
        found = 0
        for hash_id in hash_ids:
            if hash_id not in self._held:
                break
            found += 1
        return found

    def access(self, hash_ids: Sequence[int], now: float = 0.0) -> int:
        """Serves the next request (ValueError if it is not the next one given); ``now`` is
        there for the pool's interface: the optimum needs only the order."""
        position = self._position
        self._position = next_position(self._requests, position, hash_ids)
        hits = self.lookup(hash_ids)
        self._count(hits, len(hash_ids))
        upcoming = self._next[position]
        for depth, (hash_id, next_use) in enumerate(zip(hash_ids, upcoming, strict=True)):
            self._held[hash_id] = next_use
            heapq.heappush(self._heap, (-next_use, self._depth_sign * depth, hash_id))
        self._evict()
        return hits

    def _evict(self) -> None:
        capacity = self.capacity_blocks
        if capacity is not None:
            held, heap = self._held, self._heap
            while len(held) > capacity:
                negated, _, hash_id = heapq.heappop(heap)
                if held.get(hash_id) == -negated:
                    del held[hash_id]
                    self.evictions += 1
        if len(self._heap) > 2 * len(self._held) + _COMPACT_SLACK:
            self._heap = [e for e in self._heap if self._held.get(e[2]) == -e[0]]
            heapq.heapify(self._heap)


def optimal_hit_rate(requests: Sequence[Sequence[int]], capacity_blocks: int | None) -> float:
    """Belady's hit rate on ``requests`` with a pool of ``capacity_blocks``."""
    pool = OptimalPool(requests, capacity_blocks)
    for ids in requests:
        pool.access(ids)
    return pool.hit_rate
