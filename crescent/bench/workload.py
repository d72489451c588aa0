"""Workloads: the requests a bench sends, in conversations, with the time each may be sent.

Every dataset is a list of conversations; a conversation's turns go in order, each sent no
earlier than its arrival time and never before the previous turn has finished. ``trace``,
``shared-prefix`` and ``random`` make every request a conversation of its own, so only
``multiturn`` ever waits on a previous turn.

Token ids come from ``crescent.traces.block_tokens``: a trace's hash ids map to its blocks,
and synthetic prompts use negative ids, which no trace has, so they never share a block with
a trace by chance. The same seed gives the same prompts.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from crescent.bench.options import PacingOptions, WorkloadOptions
from crescent.traces import (
    TraceRecord,
    block_tokens,
    group_conversations,
    load_trace,
    prompt_for,
    scaled,
)


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """One request of a workload. ``index`` is unique in the workload and orders it by
    arrival; ``arrival_s`` counts from the start of the run (or of its round)."""

    index: int
    conversation: int
    turn: int
    arrival_s: float
    prompt: tuple[int, ...]
    max_tokens: int


Conversation = tuple[BenchRequest, ...]


def build(workload: WorkloadOptions, pacing: PacingOptions) -> list[Conversation]:
    """The requests ``workload`` describes, paced as ``pacing`` says; conversations in order
    of their first turn."""
    if workload.dataset in ("trace", "multiturn"):
        records = sorted(load_trace(workload.trace), key=lambda r: r.timestamp_ms)
        if workload.dataset == "multiturn":
            groups = first_conversations(records, workload.num_requests)
        else:
            groups = [[r] for r in records[: workload.num_requests]]
        return from_trace(groups, workload, pacing)
    arrivals = arrival_times(workload.num_requests, pacing, workload.seed)
    prompts = synthetic_prompts(workload)
    max_tokens = _capped(workload.output_len, workload.max_tokens_cap)
    return [
        (BenchRequest(i, i, 0, arrivals[i], prompt, max_tokens),)
        for i, prompt in enumerate(prompts)
    ]


def first_conversations(records: Sequence[TraceRecord], n: int) -> list[list[TraceRecord]]:
    """Whole conversations in order of their first turn until ``n`` requests (the last one
    cut there): the trace's first ``n`` lines would hold few later turns, as its
    conversations run for many minutes."""
    chosen: list[list[TraceRecord]] = []
    left = n
    for turns in group_conversations(records):
        if left <= 0:
            break
        chosen.append(turns[:left])
        left -= len(chosen[-1])
    return chosen


def from_trace(
    groups: Sequence[Sequence[TraceRecord]], workload: WorkloadOptions, pacing: PacingOptions
) -> list[Conversation]:
    """Conversations of trace records as requests; ``index`` and arrival times follow the
    trace's order over all of them."""
    records = sorted((r for turns in groups for r in turns), key=lambda r: r.timestamp_ms)
    if not records:
        return []
    start_ms = records[0].timestamp_ms
    trace_times = [(r.timestamp_ms - start_ms) / 1000 for r in records]
    arrivals = arrival_times(len(records), pacing, workload.seed, trace_times)
    index = {id(r): i for i, r in enumerate(records)}
    return [
        tuple(
            BenchRequest(
                index[id(r)],
                c,
                turn,
                arrivals[index[id(r)]],
                prompt_for(r, workload.block_tokens, workload.seed),
                _capped(scaled(r.output_length, workload.block_tokens), workload.max_tokens_cap),
            )
            for turn, r in enumerate(turns)
        )
        for c, turns in enumerate(groups)
    ]


def arrival_times(
    n: int, pacing: PacingOptions, seed: int, trace_times: Sequence[float] | None = None
) -> list[float]:
    """Seconds from the start for ``n`` requests: the trace's times scaled, Poisson arrivals
    at ``request_rate`` (the first at 0), or all at 0 for an infinite rate."""
    if pacing.timestamps:
        if trace_times is None:
            raise ValueError("trace timestamps need a trace")
        return [t * pacing.time_scale for t in trace_times[:n]]
    if pacing.request_rate == float("inf"):
        return [0.0] * n
    rng = random.Random(seed)
    times, now = [], 0.0
    for _ in range(n):
        times.append(now)
        now += rng.expovariate(pacing.request_rate)
    return times


def synthetic_prompts(workload: WorkloadOptions) -> list[tuple[int, ...]]:
    """``random``: ``input_len`` fresh tokens each. ``shared-prefix``: request ``i`` starts
    with the ``prefix_len`` tokens of group ``i % num_prefixes``, then ``input_len`` of its
    own."""
    n, seed = workload.num_requests, workload.seed
    own = [block_tokens(-1 - workload.num_prefixes - i, workload.input_len, seed) for i in range(n)]
    if workload.dataset == "random":
        return own
    prefixes = [
        block_tokens(-1 - g, workload.prefix_len, seed) for g in range(workload.num_prefixes)
    ]
    return [prefixes[i % workload.num_prefixes] + own[i] for i in range(n)]


def split_rounds(conversations: Sequence[Conversation], rounds: int) -> list[list[Conversation]]:
    """Consecutive runs of whole conversations with about the same number of requests each
    (fewer rounds when there are fewer conversations), every round's arrivals counted from its
    own first one."""
    total = sum(len(c) for c in conversations)
    rounds = max(1, min(rounds, len(conversations)))
    chunks: list[list[Conversation]] = [[]]
    done = 0
    for conversation in conversations:
        boundary = total * len(chunks) / rounds
        if chunks[-1] and done >= boundary and len(chunks) < rounds:
            chunks.append([])
        chunks[-1].append(conversation)
        done += len(conversation)
    return [_rebased(chunk) for chunk in chunks if chunk]


def _rebased(chunk: list[Conversation]) -> list[Conversation]:
    start = min(r.arrival_s for c in chunk for r in c)
    return [tuple(replace(r, arrival_s=r.arrival_s - start) for r in c) for c in chunk]


def _capped(tokens: int, cap: int | None) -> int:
    return tokens if cap is None else min(tokens, cap)
