"""The routing bench's workload builder: shared hash ids become shared token prefixes."""

from __future__ import annotations

from bench.workloads import (
    DEFAULT_SLICE,
    TOKEN_HIGH,
    TOKEN_LOW,
    TraceRecord,
    all_turns,
    block_tokens,
    build_workload,
    group_conversations,
    load_trace,
    prompt_for,
    reusable_tokens,
    select_slice,
)


def record(
    ts: int, blocks: list[int], input_length: int | None = None, out: int = 100
) -> TraceRecord:
    length = input_length if input_length is not None else 512 * len(blocks)
    return TraceRecord(ts, length, out, tuple(blocks))


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_block_tokens_are_deterministic_and_in_vocabulary() -> None:
    a = block_tokens(7, 100)
    assert a == block_tokens(7, 100)
    assert a != block_tokens(8, 100)
    assert a != block_tokens(7, 100, seed=1)
    assert len(a) == 100
    assert all(TOKEN_LOW <= t < TOKEN_HIGH for t in a)


def test_shared_hash_ids_share_exact_prefixes() -> None:
    first = prompt_for(record(0, [0, 1, 2, 3], input_length=1800), tokens_per_block=32)
    second = prompt_for(record(1, [0, 1, 2, 9, 10]), tokens_per_block=32)
    assert len(first) == 113  # 1800 trace tokens scaled by 32/512, rounded up
    assert len(second) == 160
    assert common_prefix(first, second) == 96  # three shared blocks, then different content


def test_conversations_group_by_first_two_blocks_in_trace_order() -> None:
    records = [
        record(5, [0, 1, 2]),
        record(0, [0, 4, 5]),
        record(9, [0, 1, 2, 3]),
        record(7, [0]),
    ]
    groups = group_conversations(records)
    assert [[r.timestamp_ms for r in g] for g in groups] == [[0], [5, 9], [7]]


def test_build_workload_is_a_window_of_the_trace_grouped_by_conversation() -> None:
    records = [
        record(1000, [0, 1, 2]),
        record(2000, [0, 5, 6]),
        record(4000, [0, 1, 2, 3], out=512),
        record(9000, [0, 1, 2, 3, 4]),
    ]
    conversations = build_workload(records, requests=3, max_tokens=8)
    assert [[(t.conversation, t.index) for t in c] for c in conversations] == [
        [(0, 0), (0, 1)],
        [(1, 0)],
    ]
    turns = all_turns(conversations)
    assert [t.arrival_s for t in turns] == [0.0, 1.0, 3.0]
    assert [t.max_tokens for t in turns] == [7, 7, 8]  # 100 tokens scale to 7; 512 to 32: 8
    assert len(all_turns(build_workload(records, requests=10))) == 4


def test_reusable_tokens_counts_full_blocks_seen_before() -> None:
    records = [record(0, [0, 1, 2]), record(1, [0, 1, 2, 3]), record(2, [0, 7])]
    conversations = build_workload(records, requests=3)
    # turn 2 reuses 3 blocks of its conversation; the other conversation's turn reuses block 0
    assert reusable_tokens(conversations, block_size=32) == 3 * 32 + 32


def test_select_slice_samples_whole_multi_turn_conversations() -> None:
    records = [
        record(0, [0, 1]),
        record(1, [0, 2, 3]),
        record(2, [0, 1, 5]),
        record(3, [0, 2, 3, 4, 6, 7]),  # conversation (0, 2) has a prompt over 4 blocks
        record(4, [0, 8]),  # one turn only
        record(5, [0, 9]),
        record(6, [0, 9, 10]),
        record(7, [0, 11]),
        record(8, [0, 11, 12]),
    ]
    assert [r.timestamp_ms for r in select_slice(records, 10, 4, every=1)] == [0, 2, 5, 6, 7, 8]
    assert [r.timestamp_ms for r in select_slice(records, 10, 4, every=2)] == [0, 2, 7, 8]
    assert [r.timestamp_ms for r in select_slice(records, 3, 4, every=1)] == [0, 2]


def test_the_shipped_slice_is_multi_turn_with_reuse() -> None:
    records = load_trace(DEFAULT_SLICE)
    assert 0 < len(records) <= 300
    conversations = build_workload(records, requests=20)
    turns = all_turns(conversations)
    assert len(turns) == 20
    assert any(len(c) > 1 for c in conversations)
    assert reusable_tokens(conversations, 32) > 0.3 * sum(len(t.prompt) for t in turns)
