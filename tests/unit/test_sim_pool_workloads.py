"""The synthetic workloads of the cache simulator: deterministic, forest-shaped, in time
order, and each with the structure it is named for."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from crescent.sim.synthetic import (
    WORKLOADS,
    multi_turn_workload,
    shared_prefix_workload,
    zipf_documents_workload,
)
from crescent.traces import TRACE_BLOCK_TOKENS, TraceRecord


def _small(name: str, seed: int) -> list[TraceRecord]:
    if name == "multi-turn":
        return multi_turn_workload(200, seed=seed)
    return WORKLOADS[name](600, seed=seed)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_every_workload_is_deterministic_ordered_and_a_forest(name: str) -> None:
    records = _small(name, 0)
    assert records == _small(name, 0) and records != _small(name, 1)
    times = [r.timestamp_ms for r in records]
    assert times == sorted(times)
    parent: dict[int, int | None] = {}
    for record in records:
        assert record.input_length == TRACE_BLOCK_TOKENS * len(record.hash_ids)
        assert len(set(record.hash_ids)) == len(record.hash_ids)
        for i, hash_id in enumerate(record.hash_ids):
            before = record.hash_ids[i - 1] if i else None
            assert parent.setdefault(hash_id, before) == before


def test_shared_prompts_repeat_and_tails_never_do() -> None:
    records = shared_prefix_workload(2_000, prompts=50, prompt_blocks=(3, 3), tail_blocks=(2, 2))
    prompts = Counter(r.hash_ids[:3] for r in records)
    tails = Counter(r.hash_ids[3:] for r in records)
    assert max(tails.values()) == 1
    # Zipf: the most popular prompt is far more common than the median one.
    ranked = sorted(prompts.values(), reverse=True)
    assert ranked[0] > 5 * ranked[len(ranked) // 2]


def test_documents_follow_a_shared_system_block() -> None:
    records = zipf_documents_workload(2_000, documents=500, question_blocks=(1, 1))
    assert all(r.hash_ids[0] == 0 for r in records)
    bodies = Counter(r.hash_ids[1:-1] for r in records)
    assert len(bodies) < len(records) and max(bodies.values()) > 20


def test_each_turn_extends_the_one_before() -> None:
    records = multi_turn_workload(300, mean_turns=4.0)
    by_start: dict[int, list[TraceRecord]] = {}
    for record in records:
        by_start.setdefault(record.hash_ids[1], []).append(record)
    turns = [len(v) for v in by_start.values()]
    assert len(by_start) == 300 and 3 < sum(turns) / len(turns) < 5
    for conversation in by_start.values():
        for earlier, later in itertools.pairwise(conversation):
            assert later.hash_ids[: len(earlier.hash_ids)] == earlier.hash_ids
            assert len(later.hash_ids) > len(earlier.hash_ids)
