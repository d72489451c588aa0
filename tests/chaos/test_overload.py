"""Three times the sustainable rate against a stack with a TTFT objective: the excess is
refused early and cheaply, and what is let in keeps the objective."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.faults import Stack
from bench.overload import Report, measure, render, stack_env

pytestmark = pytest.mark.slow
# Loose enough for machines without the AVX-512 kernels, where decode runs on torch's matmuls
# and the gate's predictions (which stretch by the nodes' measured misses) run near 2 s for a
# request that takes 1: what is tested is the gate's behaviour, not the machine's speed.
SLO_MS = 4000.0


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[Report]:
    stack = Stack.start(tmp_path_factory.mktemp("overload"), stack_env(cache_dir, SLO_MS), ())
    args = argparse.Namespace(factor=3.0, seconds=15.0, clients=6, max_tokens=16)
    try:
        yield asyncio.run(measure(stack, args))
    finally:
        assert stack.stop() == 0


def test_the_excess_is_refused_fast_with_retry_after(report: Report) -> None:
    print(render(report, SLO_MS))
    refused = report.of(429)
    assert len(report.of(200)) + len(refused) == len(report.shots), "a request timed out"
    assert len(refused) >= len(report.shots) // 3
    assert all(s.retry_after is not None for s in refused)
    total = report.refusals_by_bucket[float("inf")]
    assert total == len(refused)
    # The gateway's own clock: the load generator shares the two cores with the stack.
    assert report.refusals_by_bucket[0.05] / total >= 0.97


def test_admitted_requests_keep_the_ttft_objective(report: Report) -> None:
    ttfts = [s.ttft_s for s in report.of(200) if s.ttft_s is not None]
    assert len(ttfts) == len(report.of(200)) and ttfts
    within = sum(t * 1000 <= SLO_MS for t in ttfts)
    assert within >= 0.95 * len(ttfts), sorted(ttfts)[-5:]
