"""Small request traces for the simulator's cache tests: a hand-checked one, and random ones
whose hash ids form a forest (an id always follows the same parent), as in Mooncake traces."""

from __future__ import annotations

import random

# Capacity 3. Prefix-aware LRU, worked out by hand (evicting least recent leaves after each
# request): r1 stores 1-2-3; r2 hits 1, stores 4 and evicts 3 (the older leaf); r3 hits 1-2,
# stores 5, evicts 4; r4 hits 1, stores 4 again, evicts 5; r5 hits 1-2, stores 3, evicts 4.
# A plain LRU evicts chain heads (1's siblings in time), so it hits only 1 from r2 on.
HAND_TRACE: list[list[int]] = [[1, 2, 3], [1, 4], [1, 2, 5], [1, 4], [1, 2, 3]]
HAND_CAPACITY = 3
HAND_LRU_HITS = [0, 1, 2, 1, 2]
# Belady: after r2 it drops 3 (next needed at r5, the farthest), after r3 it drops 5 (never
# needed again), so r4 finds 1-4 and r5 finds 1-2.
HAND_BELADY_HITS = [0, 1, 2, 2, 2]


def random_trace(rng: random.Random, requests: int, fresh_ids: int = 6) -> list[list[int]]:
    """Requests that each continue an earlier request's prefix (or start a chain) with new
    ids, so the ids form a forest; prefixes repeat with a skew, as popular ones do."""
    trace: list[list[int]] = []
    next_id = 0
    for _ in range(requests):
        if trace and rng.random() < 0.8:
            base = trace[min(int(rng.expovariate(0.3)), len(trace) - 1)]
            prefix = base[: rng.randrange(1, len(base) + 1)]
        else:
            prefix = []
        extra = rng.randrange(0 if prefix else 1, fresh_ids)
        trace.append(prefix + list(range(next_id, next_id + extra)))
        next_id += extra
    return trace
