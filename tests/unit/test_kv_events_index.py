"""The KV event index's core: frames folded into per-publisher, per-tier views with parent
links, the trust rules (a gap, a late join, a replay, a new epoch, a resend) and prefix matches."""

from __future__ import annotations

from services.kvindex.index import KvIndex, TierMatch
from shared.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, Event, KVEventBatch


def h(i: int) -> bytes:
    return i.to_bytes(16, "big")


def stored(keys: list[int], parent: int | None, medium: str = "DRAM", size: int = 32) -> Event:
    first = None if parent is None else h(parent)
    return BlockStored([h(k) for k in keys], first, [], size, None, medium)


def removed(keys: list[int], medium: str = "DRAM") -> Event:
    return BlockRemoved([h(k) for k in keys], medium)


class Stream:
    """One publisher's frames, numbered as a feed numbers them."""

    def __init__(self, index: KvIndex, name: str = "p1", epoch: str = "e1") -> None:
        self.index, self.name, self.epoch, self.seq = index, name, epoch, 0

    def send(self, *events: Event, seq: int | None = None, now: float = 0.0) -> str:
        seq = self.seq if seq is None else seq
        self.seq = seq + 1
        folded = self.index.fold(self.name, self.epoch, seq, KVEventBatch(1.0, list(events)), now)
        return folded.resync


def leading(index: KvIndex, keys: list[int]) -> dict[str, dict[str, int]]:
    return {
        m.publisher: {t: tm.blocks for t, tm in m.tiers.items()} | {"*": m.longest.blocks}
        for m in index.match([h(k) for k in keys])
    }


def test_stored_blocks_are_matched_per_tier_with_their_parents() -> None:
    index = KvIndex()
    stream = Stream(index)
    assert stream.send(stored([1, 2, 3], 0), stored([9], 2, medium="NVME", size=16)) == ""
    view = index.publishers["p1"].tiers
    assert view["dram"].blocks == {h(1): (h(0), 32), h(2): (h(1), 32), h(3): (h(2), 32)}
    assert view["nvme"].blocks == {h(9): (h(2), 16)}
    (match,) = index.match([h(1), h(2), h(4)])
    assert match.tiers == {"dram": TierMatch(2, 64)} and match.complete


def test_removed_blocks_end_the_prefix_and_unknown_ones_are_ignored() -> None:
    index = KvIndex()
    stream = Stream(index)
    stream.send(stored([1, 2, 3], 0))
    stream.send(removed([2, 77]), removed([1], medium="NVME"))
    assert leading(index, [1, 2, 3]) == {"p1": {"dram": 1, "*": 1}}


def test_a_cleared_tier_empties_only_that_tier_and_a_bare_clear_every_tier() -> None:
    index = KvIndex()
    stream = Stream(index)
    stream.send(stored([1, 2], 0), stored([1, 2], 0, medium="NVME"))
    stream.send(AllBlocksCleared("DRAM"))
    assert leading(index, [1, 2]) == {"p1": {"nvme": 2, "*": 2}}
    stream.send(AllBlocksCleared(None))
    assert leading(index, [1, 2]) == {}


def test_the_longest_prefix_may_run_across_tiers_and_publishers_come_longest_first() -> None:
    index = KvIndex()
    Stream(index, "node").send(stored([1], 0))
    tierd = Stream(index, "tierd")
    tierd.send(stored([1], 0, medium="NVME"), stored([2, 3], 1, medium="S3"))
    matches = index.match([h(1), h(2), h(3), h(4)])
    assert [m.publisher for m in matches] == ["tierd", "node"]
    assert matches[0].tiers == {"nvme": TierMatch(1, 32)}  # S3 lacks the first block
    assert matches[0].longest == TierMatch(3, 96)
    assert index.match([h(5)]) == []


def test_a_gap_drops_the_view_until_the_publisher_resends_each_tier() -> None:
    index = KvIndex()
    stream = Stream(index)
    stream.send(stored([1, 2], 0), stored([5], 0, medium="NVME"))
    reason = stream.send(removed([2]), seq=3)  # frames 1 and 2 are lost
    assert reason == "frames 1..2 missed"
    assert leading(index, [1]) == {} and index.publishers["p1"].complete is False
    assert stream.send(stored([1], 0)) == ""  # not resent yet: ignored, not asked again
    assert leading(index, [1]) == {}
    stream.send(AllBlocksCleared("DRAM"), stored([1, 2], 0))  # the resend of one tier
    stream.send(stored([5], 0, medium="NVME"))  # another tier, not resent yet
    assert leading(index, [1, 2]) == {"p1": {"dram": 2, "*": 2}}
    assert leading(index, [5]) == {}
    stream.send(AllBlocksCleared("NVME"), stored([5], 0, medium="NVME"))
    assert leading(index, [5]) == {"p1": {"nvme": 1, "*": 1}}
    assert index.publishers["p1"].complete


def test_a_late_join_keeps_what_it_sees_and_asks_again_only_after_a_while() -> None:
    index = KvIndex(resync_after_s=5.0)
    stream = Stream(index)
    assert stream.send(stored([1], 0), seq=40, now=100.0) == "joined at frame 40"
    assert leading(index, [1]) == {"p1": {"dram": 1, "*": 1}}
    assert index.match([h(1)])[0].complete is False
    assert stream.send(stored([2], 1), now=101.0) == ""
    assert stream.send(stored([3], 2), now=105.5) == "still out of step"
    stream.send(AllBlocksCleared(None), stored([7], 0), now=106.0)
    assert leading(index, [1]) == {} and index.match([h(7)])[0].complete
    assert stream.send(stored([8], 7), now=200.0) == ""


def test_a_replayed_frame_is_ignored_and_a_new_epoch_starts_afresh() -> None:
    index = KvIndex()
    stream = Stream(index)
    stream.send(stored([1], 0))
    stream.send(removed([1]))
    stream.send(stored([1], 0), seq=0)  # a replay of frame 0
    assert leading(index, [1]) == {}
    restarted = Stream(index, epoch="e2")
    assert restarted.send(stored([4], 0)) == ""
    assert set(index.publishers["p1"].tiers["dram"].blocks) == {h(4)}


def test_integer_hashes_of_another_engine_are_matched_as_given() -> None:
    index = KvIndex()
    batch = KVEventBatch(1.0, [BlockStored([11, 12], None, [1, 2, 3, 4], 2, None, "GPU")])
    index.fold("vllm-0", "run", 0, batch, 0.0)
    (match,) = index.match([11, 12, 13])
    assert match.tiers == {"gpu": TierMatch(2, 4)}
    assert index.publishers["vllm-0"].tiers["gpu"].blocks[11] == (None, 2)
    assert index.forget("vllm-0") and index.match([11]) == []


def test_a_view_past_its_cap_drops_its_oldest_blocks_and_says_it_is_not_complete() -> None:
    index = KvIndex(max_blocks_per_view=3)
    stream = Stream(index)
    stream.send(stored([1, 2, 3], 0))
    stream.send(stored([1], 0))  # stored again: the newest now, so 2 is the oldest
    stream.send(stored([4, 5], 3))
    view = index.publishers["p1"]
    assert list(view.tiers["dram"].blocks) == [h(1), h(4), h(5)]
    assert view.tiers["dram"].trimmed == 2 and not view.whole and view.complete
    (match,) = index.match([h(1), h(2)])
    assert match.longest.blocks == 1 and not match.complete  # under-reported, never over
    stream.send(AllBlocksCleared(None))
    assert index.publishers["p1"].whole  # a cleared publisher is whole again


def test_a_publisher_past_the_cap_on_publishers_is_refused_until_one_is_forgotten() -> None:
    index = KvIndex(max_publishers=1)
    Stream(index, "p1").send(stored([1], 0))
    late = Stream(index, "p2")
    folded = index.fold("p2", "e1", 0, KVEventBatch(1.0, [stored([1], 0)]), 0.0)
    assert folded.refused and not folded.applied and set(index.publishers) == {"p1"}
    Stream(index, "p1", epoch="e2").send(stored([2], 0))  # a known one starts a new epoch
    assert index.forget("p1")
    assert late.send(stored([7], 0)) == "" and set(index.publishers) == {"p2"}
