"""Synthetic request traces in the Mooncake format, deterministic from a seed, to try eviction
policies beyond the one real trace: shared prompts under one-off tails, documents of skewed
popularity, and multi-turn conversations. Hash ids form a forest (an id always follows the same
parent), each block stands for 512 tokens, and arrivals are Poisson.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator

from crescent.traces import TRACE_BLOCK_TOKENS, TraceRecord


def _zipf_picker(rng: random.Random, n: int, skew: float) -> Callable[[], int]:
    """Draws 0..n-1 with probability proportional to ``1 / (i + 1) ** skew``."""
    cumulative = list(itertools.accumulate(1.0 / (i + 1) ** skew for i in range(n)))
    population = range(n)
    return lambda: rng.choices(population, cum_weights=cumulative)[0]


def _record(timestamp_s: float, hash_ids: list[int], output_length: int = 128) -> TraceRecord:
    return TraceRecord(
        timestamp_ms=round(timestamp_s * 1000),
        input_length=len(hash_ids) * TRACE_BLOCK_TOKENS,
        output_length=output_length,
        hash_ids=tuple(hash_ids),
    )


def _arrivals(rng: random.Random, rate_per_s: float) -> Iterator[float]:
    t = 0.0
    while True:
        t += rng.expovariate(rate_per_s)
        yield t


def shared_prefix_workload(
    requests: int = 20_000,
    *,
    prompts: int = 200,
    prompt_blocks: tuple[int, int] = (4, 40),
    tail_blocks: tuple[int, int] = (2, 40),
    skew: float = 1.0,
    rate_per_s: float = 5.0,
    seed: int = 0,
) -> list[TraceRecord]:
    """Each request is one of ``prompts`` shared prompts (Zipf-popular, lengths uniform in
    ``prompt_blocks``) followed by a tail of its own that no later request repeats: a scan of
    one-off blocks through a small hot set."""
    rng = random.Random(f"shared-prefix:{seed}")
    ids = itertools.count()
    prompt_ids = [[next(ids) for _ in range(rng.randint(*prompt_blocks))] for _ in range(prompts)]
    pick = _zipf_picker(rng, prompts, skew)
    out: list[TraceRecord] = []
    for t in itertools.islice(_arrivals(rng, rate_per_s), requests):
        tail = [next(ids) for _ in range(rng.randint(*tail_blocks))]
        out.append(_record(t, prompt_ids[pick()] + tail))
    return out


def zipf_documents_workload(
    requests: int = 20_000,
    *,
    documents: int = 20_000,
    document_blocks: tuple[int, int] = (2, 48),
    question_blocks: tuple[int, int] = (1, 3),
    skew: float = 0.8,
    rate_per_s: float = 5.0,
    seed: int = 0,
) -> list[TraceRecord]:
    """Each request reads a whole document, drawn Zipf-style from ``documents`` (block 0, a
    system prompt, before each), then asks a question of a few blocks of its own."""
    rng = random.Random(f"zipf-documents:{seed}")
    lengths = [rng.randint(*document_blocks) for _ in range(documents)]
    starts = list(itertools.accumulate(lengths, initial=1))
    pick = _zipf_picker(rng, documents, skew)
    fresh = itertools.count(starts[-1])
    out: list[TraceRecord] = []
    for t in itertools.islice(_arrivals(rng, rate_per_s), requests):
        doc = pick()
        body = list(range(starts[doc], starts[doc] + lengths[doc]))
        question = [next(fresh) for _ in range(rng.randint(*question_blocks))]
        out.append(_record(t, [0, *body, *question]))
    return out


def multi_turn_workload(
    conversations: int = 4_000,
    *,
    mean_turns: float = 3.0,
    first_blocks: tuple[int, int] = (2, 30),
    turn_blocks: tuple[int, int] = (1, 6),
    mean_think_s: float = 90.0,
    rate_per_s: float = 1.5,
    seed: int = 0,
) -> list[TraceRecord]:
    """Conversations start at ``rate_per_s``; each turn repeats all earlier turns' blocks and
    appends a few new ones, after an exponential think time; the number of turns is geometric
    with mean ``mean_turns``. Block 0, a system prompt, starts every conversation."""
    rng = random.Random(f"multi-turn:{seed}")
    ids = itertools.count(1)
    out: list[TraceRecord] = []
    for start in itertools.islice(_arrivals(rng, rate_per_s), conversations):
        blocks = [0] + [next(ids) for _ in range(rng.randint(*first_blocks))]
        t = start
        while True:
            out.append(_record(t, blocks))
            if rng.random() < 1.0 / mean_turns:
                break
            t += rng.expovariate(1.0 / mean_think_s)
            blocks = blocks + [next(ids) for _ in range(rng.randint(*turn_blocks))]
    out.sort(key=lambda r: r.timestamp_ms)
    return out


WORKLOADS: dict[str, Callable[..., list[TraceRecord]]] = {
    "shared-prefix": shared_prefix_workload,
    "zipf-documents": zipf_documents_workload,
    "multi-turn": multi_turn_workload,
}
