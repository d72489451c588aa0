"""The pool's prefix-aware LRU against a textbook LRU replay: different on purpose where
prefixes compete, within 0.01 on the conversation trace."""

from __future__ import annotations

import pytest

from crescent.sim.hitrate import PlainLru, replay
from crescent.traces import CONVERSATION_TRACE, load_trace
from tests.unit.sim_traces import HAND_CAPACITY, HAND_LRU_HITS, HAND_TRACE


def test_plain_lru_cuts_chains_at_the_head() -> None:
    # Worked by hand: after r1, r2's new block 4 pushes out 2 (the oldest), so r3 finds 1 and
    # stops; from then on each request finds its first block only.
    plain = PlainLru(HAND_CAPACITY)
    assert [plain.access(ids) for ids in HAND_TRACE] == [0, 1, 1, 1, 1]
    assert sum(HAND_LRU_HITS) == 6 > plain.hits  # the prefix-aware pool keeps whole prefixes
    unlimited = PlainLru(None)
    for ids in HAND_TRACE:
        unlimited.access(ids)
    assert unlimited.evictions == 0 and unlimited.hits == 8


@pytest.mark.parametrize("capacity", [1_000, 10_000, 30_000])
def test_the_pool_s_lru_agrees_with_a_plain_replay_on_the_trace(capacity: int) -> None:
    records = load_trace(CONVERSATION_TRACE, limit=4_000)
    pool = replay(records, "lru", capacity)
    plain = replay(records, "plain-lru", capacity)
    assert pool.requested == plain.requested
    assert abs(pool.hit_rate - plain.hit_rate) < 0.01
    assert pool.hit_rate >= plain.hit_rate  # on this trace, cutting tails first finds more
