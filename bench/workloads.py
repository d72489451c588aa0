"""Multi-turn, shared-prefix workloads built from the Mooncake conversation trace.

Each trace line is one request: ``timestamp`` (ms), ``input_length`` and ``output_length``
(tokens) and ``hash_ids``, one per 512-token block of the prompt, where equal ids mean equal
content (and, as the ids chain, an equal prefix). Lines whose first two ids agree belong to one
conversation: a later turn repeats the earlier turn's full blocks and appends new ones.

A workload maps every hash id to a deterministic block of ``tokens_per_block`` token ids (the
trace's 512 tokens scaled down, 32 by default: one KV block of Crescent's default block size),
so requests that share hash ids share exact token prefixes, and a CPU can serve them.

Making the slice in ``bench/data/`` from the whole trace (``crescent.traces.CONVERSATION_TRACE``):

    .venv/bin/python bench/workloads.py bench/data/conversation_trace.jsonl.gz \
        bench/data/conversation_slice.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from bench/

from crescent.traces import (
    TOKEN_HIGH,
    TOKEN_LOW,
    TraceRecord,
    block_tokens,
    conversation_key,
    group_conversations,
    load_trace,
    prompt_for,
    scaled,
)

__all__ = [
    "TOKEN_HIGH",
    "TOKEN_LOW",
    "TraceRecord",
    "block_tokens",
    "conversation_key",
    "group_conversations",
    "load_trace",
    "prompt_for",
    "scaled",
]

DEFAULT_SLICE = Path(__file__).resolve().parent / "data" / "conversation_slice.jsonl"


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
