"""What the policies learn of reuse: the access history that outlives eviction, and the chance
of another read by read count."""

from __future__ import annotations

import pytest

from services.tierd import holdings
from services.tierd.holdings import NVME, S3, Holdings
from services.tierd.policy import CrescentPolicy, LfuPolicy, LruPolicy
from services.tierd.reuse import EVEN_CHANCE, AccessHistory, ReuseStatistics
from tests.tierd.infos import h
from tests.tierd.test_holdings import header


def test_the_history_remembers_the_last_dropped_blocks() -> None:
    history = AccessHistory(2)
    history.remember(h("a"), 3)
    history.remember(h("b"), 1)
    history.remember(h("a"), 4)  # dropped again: now the most recent
    history.remember(h("c"), 0)
    assert len(history) == 2
    assert history.recall(h("b")) is None  # forgotten first
    assert history.recall(h("a")) == 4 and history.recall(h("a")) is None
    assert history.recall(h("c")) == 0
    none = AccessHistory(0)
    none.remember(h("a"), 1)
    assert len(none) == 0 and none.recall(h("a")) is None
    unlimited = AccessHistory(None)
    for i in range(100):
        unlimited.remember(i.to_bytes(4, "big"), i)
    assert len(unlimited) == 100 and unlimited.recall((7).to_bytes(4, "big")) == 7
    with pytest.raises(ValueError):
        AccessHistory(-1)


def _observe(stats: ReuseStatistics, counts: dict[int, int]) -> None:
    for reads, n in counts.items():
        for _ in range(n):
            stats.observe(reads)


def test_counts_of_counts_give_the_chance_of_one_more_read() -> None:
    stats = ReuseStatistics(top=3, smoothing=1e-9)
    # 100 blocks stored; 40 read once, 10 of them twice; 10 reached 3 reads and 5 went on.
    _observe(stats, {0: 100, 1: 40, 2: 10, 3: 10, 4: 3, 7: 2})
    assert stats.table() == pytest.approx([0.4, 0.25, 1.0, 5 / 15])
    assert stats.probability(3) == stats.probability(50) == pytest.approx(1 / 3)


def test_a_class_seldom_seen_behaves_like_the_one_below() -> None:
    assert ReuseStatistics().table() == [EVEN_CHANCE] * 17  # nothing learned: all alike
    stats = ReuseStatistics(top=4, smoothing=10)
    _observe(stats, {0: 1000, 1: 100})  # no block went past one read, and few were seen
    table = stats.table()
    assert table[0] == pytest.approx((100 + 10 * 0.5) / 1010)
    # 100 blocks reached one read and none went on: pulled a little toward class 0 only.
    assert table[1] == pytest.approx(10 * table[0] / 110)
    assert table[2] == table[3] == table[4] == pytest.approx(table[1])


def test_old_observations_fade_and_ratios_survive() -> None:
    stats = ReuseStatistics(top=2, smoothing=1e-9, memory=100)
    for reads in [0, 0, 1] * 40:  # steadily, half the blocks stored are read
        stats.observe(reads)
    # 120 observations: halved once at 100, so 70 (decayed) remain, in the same proportion.
    assert stats.observed == pytest.approx(70)
    assert sum(stats.reached) == pytest.approx(70)
    assert stats.table()[0] == pytest.approx(0.5, abs=0.02)
    with pytest.raises(ValueError):
        ReuseStatistics(top=0)


def test_remembered_counts_never_make_a_chance_above_one() -> None:
    stats = ReuseStatistics(top=2, smoothing=1e-9)
    _observe(stats, {0: 5, 1: 20})  # blocks whose count came from memory, not seen stored
    assert stats.table()[0] == pytest.approx(1.0)


def test_tierd_s_holdings_teach_a_learning_policy() -> None:
    policy = CrescentPolicy()
    held = Holdings(policy)
    held.add(header("a"), NVME, now=0)
    held.add(header("a"), S3, now=1)  # a second copy is no new block
    held.add(header("b"), NVME, now=1)
    held.touch([h("a"), h("a"), h("gone")], now=2)
    assert policy.reuse.reached[:3] == [2.0, 1.0, 1.0]


def test_the_history_peeks_and_shrinks_to_a_new_capacity() -> None:
    history = AccessHistory(4)
    for i in range(4):
        history.remember(h(f"b{i}"), i)
    assert history.peek(h("b3")) == 3 and len(history) == 4  # peeking forgets nothing
    history.capacity = 2
    history.remember(h("b4"), 4)  # trimmed to the new capacity, oldest first
    assert len(history) == 2 and history.peek(h("b2")) is None
    assert history.peek(h("b3")) == 3 and history.peek(h("b4")) == 4
    history.capacity = 0
    history.remember(h("b5"), 5)
    assert len(history) == 0 and history.recall(h("b4")) is None


def test_a_block_dropped_by_tierd_comes_back_with_its_count() -> None:
    policy = CrescentPolicy()
    held = Holdings(policy)
    held.add(header("a"), NVME, now=0)
    held.touch([h("a"), h("a")], now=1)  # read twice
    assert held.remove(h("a"), NVME)  # its last copy: dropped, its use remembered
    assert held.history.peek(h("a")) == 2
    # Admission prices it as it will start: used once more than before it was dropped.
    hot = Holdings(LfuPolicy())
    hot.history.remember(h("a"), 2)
    hot.add(header("b"), NVME, now=0)
    hot.touch([h("b")] * 2, now=1)  # read twice: a newcomer read never ranks below it
    assert hot.admits(header("a"), [h("b")], now=2)
    assert hot.history.peek(h("a")) == 2  # the admission test forgets nothing
    assert not hot.admits(header("c"), [h("b")], now=2)
    held.add(header("a"), S3, now=5)
    assert held.blocks[h("a")].access_count == 3
    assert held.history.peek(h("a")) is None  # recalled: forgotten
    # The policy saw it stored, read twice, and come back as a third use.
    assert policy.reuse.reached[:4] == [1.0, 1.0, 1.0, 1.0]


def test_tierd_remembers_a_few_dropped_blocks_per_block_it_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(holdings, "MIN_HISTORY", 3)
    held = Holdings(LruPolicy())
    for i in range(4):
        held.add(header(f"x{i}"), NVME, now=i)
    for i in range(4):
        held.remove(h(f"x{i}"), NVME)
    # At most HISTORY_PER_BLOCK per block still held, never fewer than MIN_HISTORY.
    assert len(held.history) == 3
    assert held.history.peek(h("x0")) is None and held.history.peek(h("x3")) == 0
    for i in range(2):
        held.add(header(f"y{i}"), NVME, now=10)
    held.add(header("z"), NVME, now=10)
    held.remove(h("z"), NVME)
    assert held.history.capacity == holdings.HISTORY_PER_BLOCK * 2
    assert len(held.history) == 4
