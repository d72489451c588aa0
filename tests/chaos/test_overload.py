"""Three times the sustainable rate against a stack with a TTFT objective: the excess is
refused with 429 and a Retry-After, nothing is lost, and the gateway counts every refusal.

What is asserted is what the gate did, on any host: the figures that depend on the host's
speed (how soon a refusal goes out, how many admitted requests keep the objective) are
printed here and measured by ``bench/overload.py`` on a quiet machine (docs/benchmarks.md,
"Faults and overload"). A host busy with other work is slower than any fixed objective
assumes; the gate then lets in what a node would start at once and refuses the queue.
"""

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
# request that takes 1.
SLO_MS = 4000.0


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[Report]:
    stack = Stack.start(tmp_path_factory.mktemp("overload"), stack_env(cache_dir, SLO_MS), ())
    args = argparse.Namespace(factor=3.0, seconds=15.0, clients=6, max_tokens=16)
    try:
        yield asyncio.run(measure(stack, args))
    finally:
        assert stack.stop() == 0


def test_the_excess_is_refused_with_retry_after_and_nothing_is_lost(report: Report) -> None:
    print(render(report, SLO_MS))
    refused = report.of(429)
    assert len(report.of(200)) + len(refused) == len(report.shots), "a request timed out"
    assert all(not s.error for s in report.shots)
    assert len(refused) >= len(report.shots) // 3
    assert all(s.retry_after is not None and int(s.retry_after) >= 1 for s in refused)
    # The gateway counted each refusal it sent (its response-start histogram).
    assert report.refusals_by_bucket[float("inf")] == len(refused)


def test_admitted_requests_stream_their_tokens(report: Report) -> None:
    admitted = report.of(200)
    assert admitted, "nothing was let in"
    assert all(s.ttft_s is not None for s in admitted)
