"""Mooncake-format request traces: parsing, conversations, and hash ids made into token ids.

Each line of a trace is one request: ``timestamp`` (ms since the trace began),
``input_length`` and ``output_length`` (tokens), and ``hash_ids``, one per 512-token block of
the prompt, where equal ids mean equal content (and, as the ids chain, an equal prefix). This
is the format of the traces released with the Mooncake paper (FAST 2025,
https://github.com/kvcache-ai/Mooncake). Files may be gzip-compressed (``.gz``).

Turns of one conversation share their first two ids (the first is a system prompt every
request shares): a later turn repeats the earlier turn's full blocks and appends new ones.

A workload maps every hash id to a deterministic block of ``block_tokens`` token ids (the
trace's 512 tokens scaled down: 32 by default, one KV block of Crescent's default block size),
so requests that share hash ids share exact token prefixes, and a CPU can serve them.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

TRACE_BLOCK_TOKENS = 512
TOKEN_LOW, TOKEN_HIGH = 100, 49_000  # inside SmolLM2's 49,152-token vocabulary
DATA_DIR = Path(__file__).resolve().parents[1] / "bench" / "data"
#: The whole Mooncake conversation trace, as released (gzip-compressed).
CONVERSATION_TRACE = DATA_DIR / "conversation_trace.jsonl.gz"
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


class TraceError(ValueError):
    """A trace line that is not a request; the message names the file and line number."""


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One request of a trace, as the trace gives it (lengths in trace tokens)."""

    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    @classmethod
    def from_json(cls, line: str) -> TraceRecord:
        """One record; ValueError naming what is wrong with the line."""
        try:
            d = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        missing = [f for f in _FIELDS if f not in d]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        ids = d["hash_ids"]
        if not isinstance(ids, list) or not all(_is_count(h) for h in ids):
            raise ValueError("hash_ids must be a list of non-negative integers")
        for name in _FIELDS[:3]:
            if not _is_count(d[name]):
                raise ValueError(f"{name} must be a non-negative integer, got {d[name]!r}")
        return cls(d["timestamp"], d["input_length"], d["output_length"], tuple(ids))

    def to_json(self) -> str:
        return json.dumps(
            {
                "timestamp": self.timestamp_ms,
                "input_length": self.input_length,
                "output_length": self.output_length,
                "hash_ids": list(self.hash_ids),
            }
        )


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _open(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def iter_trace(path: Path) -> Iterator[TraceRecord]:
    """The records of ``path`` in file order; blank lines are skipped. TraceError on the first
    bad line, with its number."""
    try:
        f = _open(path)
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the trace ({exc.strerror or exc})") from None
    with f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield TraceRecord.from_json(line)
            except ValueError as exc:
                raise TraceError(f"{path}:{number}: {exc}") from None


def load_trace(path: Path, limit: int | None = None) -> list[TraceRecord]:
    """The first ``limit`` records of ``path`` (all when None)."""
    records: list[TraceRecord] = []
    for record in iter_trace(path):
        if limit is not None and len(records) >= limit:
            break
        records.append(record)
    return records


def conversation_key(record: TraceRecord) -> tuple[int, ...]:
    """Turns of one conversation share their first two blocks (the first is a system prompt
    every request shares); a one-block request is a conversation of its own."""
    return record.hash_ids[:2] if len(record.hash_ids) > 1 else (-1, id(record))


def group_conversations(records: Iterable[TraceRecord]) -> list[list[TraceRecord]]:
    """Conversations in order of their first turn; turns in trace order."""
    groups: dict[tuple[int, ...], list[TraceRecord]] = {}
    for record in sorted(records, key=lambda r: r.timestamp_ms):
        groups.setdefault(conversation_key(record), []).append(record)
    return list(groups.values())


def block_tokens(hash_id: int, n: int, seed: int = 0) -> tuple[int, ...]:
    """``n`` token ids in [TOKEN_LOW, TOKEN_HIGH), the same for the same hash id and seed."""
    ids: list[int] = []
    counter = 0
    while len(ids) < n:
        digest = hashlib.blake2b(f"{seed}:{hash_id}:{counter}".encode(), digest_size=64).digest()
        ids.extend(
            TOKEN_LOW + int.from_bytes(digest[i : i + 4], "little") % (TOKEN_HIGH - TOKEN_LOW)
            for i in range(0, len(digest), 4)
        )
        counter += 1
    return tuple(ids[:n])


def scaled(length: int, tokens_per_block: int) -> int:
    """A trace token count in workload tokens, rounded up, at least 1."""
    return max(1, -(-length * tokens_per_block // TRACE_BLOCK_TOKENS))


def prompt_for(record: TraceRecord, tokens_per_block: int, seed: int = 0) -> tuple[int, ...]:
    """The record's blocks in order, the last one cut to the scaled input length."""
    length = min(
        scaled(record.input_length, tokens_per_block), len(record.hash_ids) * tokens_per_block
    )
    ids: list[int] = []
    for hash_id in record.hash_ids:
        if len(ids) >= length:
            break
        ids.extend(block_tokens(hash_id, tokens_per_block, seed))
    return tuple(ids[:length])
