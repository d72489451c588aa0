"""Synthetic workloads for ``crescent plan``: the trace they make has the rate, the mix and the
shared prefix asked for, in the simulator's tokens for either cost model."""

from __future__ import annotations

import itertools
import statistics
from collections import Counter

import pytest

from crescent.plan.workload import Lengths, Workload, parse_mix
from crescent.sim.costs import cost_model
from crescent.traces import scaled

MIX = (Lengths(1000, 100, 3.0), Lengths(5000, 400, 1.0))


@pytest.mark.parametrize("model", ["a800", "local"])
def test_lengths_come_back_as_the_simulator_reads_them(model: str) -> None:
    block = cost_model(model).block_tokens
    records = Workload(2.0, MIX, requests=2000).records(block)
    kinds = Counter(
        (scaled(r.input_length, block), scaled(r.output_length, block)) for r in records
    )
    assert set(kinds) == {(1000, 100), (5000, 400)}
    assert kinds[(1000, 100)] / len(records) == pytest.approx(0.75, abs=0.04)
    for r in records:  # one hash id per trace block of the prompt
        assert len(r.hash_ids) == -(-r.input_length // 512)


def test_arrivals_are_at_the_rate() -> None:
    records = Workload(5.0, MIX, requests=4000, seed=1).records(512)
    gaps = [(b.timestamp_ms - a.timestamp_ms) / 1000 for a, b in itertools.pairwise(records)]
    assert statistics.mean(gaps) == pytest.approx(0.2, rel=0.05)
    assert records == Workload(5.0, MIX, requests=4000, seed=1).records(512)  # seeded
    assert records != Workload(5.0, MIX, requests=4000, seed=2).records(512)


def test_the_shared_share_of_each_prompt() -> None:
    records = Workload(1.0, MIX, shared_share=0.5, requests=200).records(512)
    for r in records:
        shared = len(r.hash_ids) // 2
        assert r.hash_ids[:shared] == tuple(range(shared))
    own = [i for r in records for i in r.hash_ids[len(r.hash_ids) // 2 :]]
    assert len(own) == len(set(own))  # the rest is each request's own
    alone = Workload(1.0, MIX, requests=200).records(512)
    ids = [i for r in alone for i in r.hash_ids]
    assert len(ids) == len(set(ids))


def test_mean_lengths_by_weight() -> None:
    assert Workload(1.0, MIX).mean_lengths() == (2000.0, 175.0)


def test_parse_mix() -> None:
    assert parse_mix("1000:100:3, 5000:400") == MIX
    for bad in ("1000", "1000:x", "0:10", "10:10:0", "1:2:3:4"):
        with pytest.raises(ValueError, match=r"PROMPT:OUTPUT|positive"):
            parse_mix(bad)


@pytest.mark.parametrize(
    "bad",
    [
        {"rate_per_s": 0.0},
        {"mix": ()},
        {"mix": (Lengths(0, 1),)},
        {"shared_share": 1.5},
        {"requests": 0},
    ],
)
def test_impossible_workloads_are_refused(bad: dict[str, object]) -> None:
    fields: dict[str, object] = {"rate_per_s": 1.0, "mix": MIX, **bad}
    with pytest.raises(ValueError):
        Workload(**fields)  # type: ignore[arg-type]
