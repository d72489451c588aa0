"""Multi-turn, shared-prefix workloads built from the Mooncake conversation trace.

Each trace line is one request: ``timestamp`` (ms), ``input_length`` and ``output_length``
(tokens) and ``hash_ids``, one per 512-token block of the prompt, where equal ids mean equal
content (and, as the ids chain, an equal prefix). Lines whose first two ids agree belong to one
conversation: a later turn repeats the earlier turn's full blocks and appends new ones.

A workload maps every hash id to a deterministic block of ``tokens_per_block`` token ids (the
trace's 512 tokens scaled down, 32 by default: one KV block of Crescent's default block size),
so requests that share hash ids share exact token prefixes, and a CPU can serve them.

Making the slice in ``bench/data/`` (the whole trace is not part of the repo):

    .venv/bin/python bench/workloads.py SOURCE.jsonl bench/data/conversation_slice.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

TRACE_BLOCK_TOKENS = 512
TOKEN_LOW, TOKEN_HIGH = 100, 49_000  # inside SmolLM2's 49,152-token vocabulary
DEFAULT_SLICE = Path(__file__).resolve().parent / "data" / "conversation_slice.jsonl"


@dataclass(frozen=True, slots=True)
class TraceRecord:
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    @classmethod
    def from_json(cls, line: str) -> TraceRecord:
        d = json.loads(line)
        ids = tuple(int(h) for h in d["hash_ids"])
        return cls(int(d["timestamp"]), int(d["input_length"]), int(d["output_length"]), ids)

    def to_json(self) -> str:
        return json.dumps(
            {
                "timestamp": self.timestamp_ms,
                "input_length": self.input_length,
                "output_length": self.output_length,
                "hash_ids": list(self.hash_ids),
            }
        )


@dataclass(frozen=True, slots=True)
class Turn:
    """One request of a conversation: sent ``arrival_s`` after the run starts (before any
    speed-up), and never before the conversation's previous turn has finished."""

    conversation: int
    index: int
    arrival_s: float
    prompt: tuple[int, ...]
    max_tokens: int


Conversation = list[Turn]


def load_trace(path: Path) -> list[TraceRecord]:
    with path.open() as f:
        return [TraceRecord.from_json(line) for line in f if line.strip()]


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


def select_slice(
    records: Sequence[TraceRecord], max_lines: int, max_blocks: int, every: int
) -> list[TraceRecord]:
    """A systematic sample of whole conversations: of the multi-turn conversations whose every
    prompt has at most ``max_blocks`` blocks, every ``every``-th in order of its first turn,
    until ``max_lines`` lines; returned in trace order. Sampling across the whole trace keeps
    the arrival rate steady (its multi-turn conversations crowd its first minutes)."""
    eligible = [
        turns
        for turns in group_conversations(records)
        if len(turns) >= 2 and max(len(t.hash_ids) for t in turns) <= max_blocks
    ]
    chosen: list[TraceRecord] = []
    for turns in eligible[::every]:
        if len(chosen) + len(turns) > max_lines:
            break
        chosen.extend(turns)
    return sorted(chosen, key=lambda r: r.timestamp_ms)


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


def build_workload(
    records: Sequence[TraceRecord],
    requests: int,
    tokens_per_block: int = 32,
    max_tokens: int = 8,
    seed: int = 0,
) -> list[Conversation]:
    """The first ``requests`` records in trace order (a window of the trace: conversations
    still going at its end are cut there), grouped into conversations in order of their first
    turn. Arrival times count from the window's first request."""
    window = sorted(records, key=lambda r: r.timestamp_ms)[:requests]
    if not window:
        return []
    start_ms = window[0].timestamp_ms
    return [
        [
            Turn(
                conversation=c,
                index=i,
                arrival_s=(r.timestamp_ms - start_ms) / 1000,
                prompt=prompt_for(r, tokens_per_block, seed),
                max_tokens=min(max_tokens, scaled(r.output_length, tokens_per_block)),
            )
            for i, r in enumerate(turns)
        ]
        for c, turns in enumerate(group_conversations(window))
    ]


def all_turns(conversations: Iterable[Conversation]) -> list[Turn]:
    """Every turn, in order of arrival."""
    return sorted(
        (t for c in conversations for t in c), key=lambda t: (t.arrival_s, t.conversation)
    )


def reusable_tokens(conversations: Iterable[Conversation], block_size: int) -> int:
    """Prompt tokens one unbounded prefix cache could serve when turns arrive in order: per
    turn, the longest run of full blocks that an earlier turn already had (at least the last
    prompt token is always computed)."""
    seen: set[bytes] = set()
    total = 0
    for turn in all_turns(conversations):
        chain = _prefix_chain(turn.prompt, block_size)
        cacheable = (len(turn.prompt) - 1) // block_size
        hits = 0
        while hits < cacheable and chain[hits] in seen:
            hits += 1
        total += hits * block_size
        seen.update(chain)
    return total


def _prefix_chain(prompt: Sequence[int], block_size: int) -> list[bytes]:
    """One key per full block: a hash of the whole prefix up to that block's end."""
    keys: list[bytes] = []
    parent = b""
    for end in range(block_size, len(prompt) + 1, block_size):
        block = b"".join(t.to_bytes(4, "little") for t in prompt[end - block_size : end])
        parent = hashlib.blake2b(parent + block, digest_size=16).digest()
        keys.append(parent)
    return keys


def main() -> None:
    parser = argparse.ArgumentParser(description="cut a slice of multi-turn conversations")
    parser.add_argument("source", type=Path, help="the Mooncake conversation_trace.jsonl")
    parser.add_argument("dest", type=Path)
    parser.add_argument("--lines", type=int, default=300)
    parser.add_argument("--max-blocks", type=int, default=24, help="512-token blocks per prompt")
    parser.add_argument("--every", type=int, default=10, help="take every N-th conversation")
    args = parser.parse_args()
    chosen = select_slice(load_trace(args.source), args.lines, args.max_blocks, args.every)
    args.dest.parent.mkdir(parents=True, exist_ok=True)
    args.dest.write_text("".join(r.to_json() + "\n" for r in chosen))
    print(f"{len(chosen)} lines, {len(group_conversations(chosen))} conversations -> {args.dest}")


if __name__ == "__main__":
    main()
