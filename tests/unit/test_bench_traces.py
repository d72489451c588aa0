"""Trace parsing and the hash-id → token mapping the bench's workloads stand on."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from crescent.traces import (
    CONVERSATION_TRACE,
    TOKEN_HIGH,
    TOKEN_LOW,
    TraceError,
    TraceRecord,
    block_tokens,
    load_trace,
    prompt_for,
    scaled,
)


def _line(ts: int, ids: list[int], inp: int | None = None, out: int = 10) -> str:
    length = inp if inp is not None else 512 * len(ids)
    return json.dumps(
        {"timestamp": ts, "input_length": length, "output_length": out, "hash_ids": ids}
    )


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"timestamp": 1, "input_length": 2, "output_length": 3}', "missing hash_ids"),
        (
            '{"timestamp": 1, "input_length": 2, "output_length": 3, "hash_ids": [1, -2]}',
            "hash_ids must be a list of non-negative integers",
        ),
        (
            '{"timestamp": -5, "input_length": 2, "output_length": 3, "hash_ids": [1]}',
            "timestamp must be a non-negative integer",
        ),
        (
            '{"timestamp": 1, "input_length": true, "output_length": 3, "hash_ids": [1]}',
            "input_length must be a non-negative integer",
        ),
    ],
)
def test_a_bad_line_is_named_by_its_number(tmp_path: Path, bad: str, says: str) -> None:
    # A blank line still counts: the number is the line's in the file, as an editor shows it.
    path = _write(tmp_path / "t.jsonl", [_line(0, [1]), "", _line(5, [1, 2]), bad, _line(9, [3])])
    with pytest.raises(TraceError) as caught:
        load_trace(path)
    assert str(caught.value).startswith(f"{path}:4: ")
    assert says in str(caught.value)


def test_gzip_traces_and_limits_read_like_plain_ones(tmp_path: Path) -> None:
    lines = [_line(10 * i, [0, i]) for i in range(5)]
    plain = _write(tmp_path / "t.jsonl", lines)
    packed = tmp_path / "t.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert load_trace(packed) == load_trace(plain)
    assert [r.timestamp_ms for r in load_trace(packed, limit=3)] == [0, 10, 20]


def test_an_unreadable_trace_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read the trace"):
        load_trace(tmp_path / "missing.jsonl")


def test_the_shipped_trace_parses() -> None:
    records = load_trace(CONVERSATION_TRACE, limit=50)
    assert len(records) == 50
    assert all(r.hash_ids for r in records)


def test_blocks_are_deterministic_and_in_the_vocabulary() -> None:
    block = block_tokens(7, 40, seed=3)
    assert block == block_tokens(7, 40, seed=3)
    assert len(block) == 40
    assert all(TOKEN_LOW <= t < TOKEN_HIGH for t in block)
    assert block != block_tokens(8, 40, seed=3)
    assert block != block_tokens(7, 40, seed=4)
    # A longer block of the same id starts with the shorter one.
    assert block_tokens(7, 100, seed=3)[:40] == block


def test_shared_hash_ids_give_shared_token_prefixes() -> None:
    first = TraceRecord(0, 3 * 512, 8, (1, 2, 3))
    later = TraceRecord(10, 4 * 512, 8, (1, 2, 3, 4))
    other = TraceRecord(20, 3 * 512, 8, (1, 9, 3))
    a, b, c = (prompt_for(r, 32) for r in (first, later, other))
    assert len(a) == 96 and len(b) == 128
    assert b[:96] == a
    # Only the first block is shared with `other`: its second id differs.
    assert c[:32] == a[:32]
    assert c[32:64] != a[32:64]


def test_the_last_block_is_cut_to_the_scaled_length() -> None:
    record = TraceRecord(0, 512 + 100, 8, (1, 2))
    prompt = prompt_for(record, 32)
    assert len(prompt) == scaled(612, 32) == 39
    assert prompt[32:] == block_tokens(2, 32)[:7]
    assert scaled(1, 32) == 1 and scaled(0, 32) == 1 and scaled(512, 512) == 512
