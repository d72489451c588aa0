"""Reusing the leading tokens of a block: a finished sequence's partial block taken back, a
cached full block copied, and neither once the pool has handed the slot out again."""

from __future__ import annotations

from shared.engine.kv_manager import KVCacheManager
from shared.engine.partial_blocks import PartialBlocks, common_prefix
from shared.engine.sequence import Sequence
from shared.kv.hashing import root_hash
from shared.kv.pool import BlockPool
from shared.sampling_params import SamplingParams

BS = 4
ROOT = root_hash("m", BS, "float32")


class Copies:
    """Records the block copies the manager asks for."""

    def __init__(self) -> None:
        self.made: list[tuple[int, int]] = []

    def __call__(self, src: int, dst: int) -> None:
        self.made.append((src, dst))


def manager(num_blocks: int = 16) -> tuple[KVCacheManager, Copies]:
    copies = Copies()
    return KVCacheManager(BlockPool(num_blocks), BS, True, copies), copies


def run(kv: KVCacheManager, tokens: list[int], computed: int) -> list[int]:
    """A sequence admitted as the engine's scheduler admits one, its first ``computed``
    tokens computed (and its full blocks published), then finished and freed; its slots."""
    seq = Sequence("r", tokens, SamplingParams(max_tokens=1), ROOT)
    admit(kv, seq)
    seq.num_computed_tokens = computed
    kv.cache_computed_blocks(seq)
    slots = [b.block_id for b in seq.block_table]
    kv.free(seq)
    return slots


def admit(kv: KVCacheManager, seq: Sequence) -> int:
    cached = kv.find_cached_prefix(seq)
    partial = kv.find_partial_block(seq, len(cached))
    reused = len(cached) * BS + (partial.num_tokens if partial else 0)
    assert kv.allocate(seq, seq.num_tokens, cached, partial)
    seq.num_computed_tokens = reused
    return reused


def test_a_finished_partial_block_is_taken_back_without_a_copy() -> None:
    kv, copies = manager()
    slots = run(kv, list(range(10, 20)), computed=10)  # 2 full blocks, 2 tokens in the third
    assert len(kv.partials) == 1
    again = Sequence("s", [*range(10, 20), 99], SamplingParams(max_tokens=1), ROOT)
    assert admit(kv, again) == 10  # 8 from full blocks, 2 taken back
    assert again.block_table[2].block_id == slots[2] and again.block_table[2].ref_cnt == 1
    assert copies.made == [] and len(kv.partials) == 0


def test_the_first_tokens_of_a_cached_block_are_copied_and_the_block_stays_cached() -> None:
    kv, copies = manager()
    slots = run(kv, list(range(10, 22)), computed=12)  # 3 full blocks, all cached
    again = Sequence("s", [*range(10, 21), 99], SamplingParams(max_tokens=1), ROOT)
    # The prompt's last token is the 12th: 2 full blocks, and 3 tokens of the third copied.
    assert admit(kv, again) == 11
    assert len(copies.made) == 1
    src, dst = copies.made[0]
    assert src == slots[2] and again.block_table[2].block_id == dst != src
    assert kv.pool.blocks[src].block_hash is not None  # the shared block is left as it was
    assert kv.pool.blocks[src].ref_cnt == 0


def test_a_slot_handed_out_since_or_another_tenant_is_never_reused() -> None:
    kv, copies = manager(num_blocks=4)
    run(kv, list(range(10, 20)), computed=10)  # slots 0 and 1 cached, 2 partial, 3 unused
    other = Sequence("o", [*range(10, 20), 1], SamplingParams(max_tokens=1), b"x" * 16)
    assert admit(kv, other) == 0  # another root (tenant, model): no hit at all
    kv.free(other)
    run(kv, list(range(10, 20)), computed=10)  # the same again: slot 2 is partial once more
    taken = kv.pool.allocate(2)  # the two slots freed longest ago: 3, then the partial one
    assert taken is not None and 2 in [b.block_id for b in taken]
    kv.pool.free(taken)
    again = Sequence("s", [*range(10, 20), 1], SamplingParams(max_tokens=1), ROOT)
    full = kv.find_cached_prefix(again)
    assert len(full) == 2 and kv.find_partial_block(again, len(full)) is None
    assert copies.made == []


def test_the_registry_forgets_the_oldest_and_matches_the_longest() -> None:
    pool = BlockPool(8)
    partials = PartialBlocks(capacity=2)
    for i, tokens in enumerate([(1, 2), (1, 2, 3), (7,)]):
        partials.remember(ROOT, pool.blocks[i], tokens)
    assert len(partials) == 2  # (1, 2) was forgotten
    hit = partials.find(ROOT, [1, 2, 3, 4], limit=3)
    assert hit is not None and hit.num_tokens == 3 and hit.source is pool.blocks[1]
    assert partials.find(ROOT, [1, 2, 3, 4], limit=2).num_tokens == 2  # type: ignore[union-attr]
    assert partials.find(ROOT, [5], limit=3) is None
    assert common_prefix((1, 2, 3), [1, 2, 4], 5) == 2 and common_prefix((), [1], 1) == 0
