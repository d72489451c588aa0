"""Recent placements stand in for the catalogue until it has caught up."""

from __future__ import annotations

from services.scheduler.recent import RecentPlacements, merge
from shared.rpc.types import PrefixHolder

H = [bytes([i]) * 16 for i in range(6)]


def test_a_placed_prompt_is_held_where_it_was_placed_until_its_record_expires() -> None:
    recent = RecentPlacements(ttl_s=3.0)
    recent.record(H[:4], "decode-0", now=10.0)
    assert recent.holders(H, now=11.0) == [PrefixHolder("decode-0", "dram", 4)]
    assert recent.holders([H[4], *H[:4]], now=11.0) == []  # a run starts at the first block
    assert recent.holders(H, now=13.0) == []
    assert len(recent) == 0


def test_a_slow_prefill_is_remembered_from_when_it_should_end() -> None:
    recent = RecentPlacements(ttl_s=3.0)
    recent.record(H[:3], "decode-0", now=10.0, ready_in_s=4.0)
    assert recent.holders(H, now=16.5) == [PrefixHolder("decode-0", "dram", 3)]
    assert recent.holders(H, now=17.0) == []


def test_each_node_gets_its_own_leading_run_and_a_new_record_extends_the_old() -> None:
    recent = RecentPlacements(ttl_s=3.0)
    recent.record(H[:2], "prefill-0", now=10.0)
    recent.record(H[:5], "prefill-1", now=11.0)
    recent.record(H[:2], "prefill-0", now=12.5)  # placed again: held until 15.5
    assert recent.holders(H, now=12.0) == [
        PrefixHolder("prefill-0", "dram", 2),
        PrefixHolder("prefill-1", "dram", 5),
    ]
    assert recent.holders(H, now=14.5) == [PrefixHolder("prefill-0", "dram", 2)]


def test_a_restarted_or_lost_node_is_forgotten_at_once() -> None:
    """A long prefill is remembered for its predicted time; if its node restarts meanwhile, a
    prompt asked again must not be priced as a pool hit there (it was recomputed, 218 s on
    an 8B model, while NVMe held it)."""
    recent = RecentPlacements(ttl_s=3.0)
    recent.record(H[:4], "prefill-0", now=10.0, ready_in_s=200.0)
    recent.record(H[:2], "decode-0", now=10.0)
    recent.forget("prefill-0")
    assert recent.holders(H, now=11.0) == [PrefixHolder("decode-0", "dram", 2)]
    recent.forget("decode-0")
    assert recent.holders(H, now=11.0) == [] and len(recent) == 0
    assert recent.holders(H, now=300.0) == []  # the queued expiries of forgotten records


def test_merging_keeps_the_longer_run_of_each_pool_and_every_other_holder() -> None:
    listed = [PrefixHolder("prefill-0", "dram", 3), PrefixHolder("tierd", "s3", 6)]
    recent = [PrefixHolder("prefill-0", "dram", 5), PrefixHolder("decode-0", "dram", 2)]
    assert merge(listed, recent) == [
        PrefixHolder("prefill-0", "dram", 5),
        PrefixHolder("tierd", "s3", 6),
        PrefixHolder("decode-0", "dram", 2),
    ]
    assert merge(listed, []) == listed
