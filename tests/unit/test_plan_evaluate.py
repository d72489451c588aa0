"""One shape of a plan, simulated and measured: the latencies at the attainment quantile, the
shares missing each objective, refused requests counted as missing both, and the attainment
the same as ``crescent sim`` reports."""

from __future__ import annotations

import math

import pytest

from crescent.plan.evaluate import SimulatedCluster, measure
from crescent.plan.shapes import Objectives, Shape
from crescent.sim.cluster import SimConfig, simulate
from crescent.sim.nodes import Job
from crescent.traces import CONVERSATION_TRACE, load_trace

OBJECTIVES = Objectives(ttft_s=1.0, tpot_s=0.1, attainment=0.8)


def job(index: int, ttft: float, tpot: float, *, rejected: bool = False) -> Job:
    done = Job(index, arrival=10.0, prompt_tokens=100, output_tokens=11, hash_ids=())
    done.first_token = 10.0 + ttft
    done.finished = done.first_token + 10 * tpot
    done.rejected = rejected
    return done


def test_latencies_at_the_quantile_and_the_misses() -> None:
    jobs = [job(i, 0.1 * (i + 1), 0.05) for i in range(9)]  # TTFT 0.1 .. 0.9 s
    jobs.append(job(9, 0.05, 0.5))  # the fastest first token, slow after it
    found = measure(Shape(2, 1), jobs, OBJECTIVES, attainment=0.9)
    # 80% (8 of 10) are within the 8th fastest TTFT, 0.7 s, and every TPOT but one.
    assert found.ttft_s == pytest.approx(0.7)
    assert found.tpot_s == pytest.approx(0.05)
    assert (found.ttft_missed, found.tpot_missed) == (0.0, 0.1)
    assert (found.requests, found.rejected, found.attainment) == (10, 0, 0.9)


def test_refused_requests_miss_both() -> None:
    jobs = [job(i, 0.5, 0.05) for i in range(7)]
    jobs += [job(7 + i, 0.0, 0.0, rejected=True) for i in range(3)]
    found = measure(Shape(1, 1), jobs, OBJECTIVES, attainment=0.7)
    assert (found.ttft_missed, found.tpot_missed) == (0.3, 0.3)
    assert math.isinf(found.ttft_s) and math.isinf(found.tpot_s)
    assert found.rejected == 3


def test_a_simulated_shape_agrees_with_crescent_sim() -> None:
    records = load_trace(CONVERSATION_TRACE, 300)
    base = SimConfig(cost_model="a800", time_scale=0.25)
    objectives = Objectives(ttft_s=10.0, tpot_s=0.1, attainment=0.9)
    cluster = SimulatedCluster(records, base, objectives)
    found = cluster(Shape(2, 1))
    sim = simulate(cluster.config(Shape(2, 1)), records)
    assert (sim.prefill_nodes, sim.decode_nodes) == (2, 1)
    assert (sim.slo_ttft_ms, sim.slo_tpot_ms) == (10_000.0, 100.0)
    assert found.attainment == sim.slo_attainment
    assert found.requests == sim.requests == 300
    # Meeting both is rarer than meeting either.
    assert found.attainment <= 1 - max(found.ttft_missed, found.tpot_missed)
