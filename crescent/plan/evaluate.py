"""One shape of a plan, simulated: ``crescent sim``'s cluster replaying the workload, measured
against the plan's objectives."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from crescent.plan.shapes import Objectives, Outcome, Shape
from crescent.sim.cluster import SimConfig, Simulation
from crescent.sim.nodes import Job
from crescent.traces import TraceRecord


def measure(
    shape: Shape, jobs: Sequence[Job], objectives: Objectives, attainment: float
) -> Outcome:
    """``shape``'s outcome from its simulated ``jobs``; ``attainment`` is the simulation's
    own figure (the same rule as ``crescent sim``'s ``slo_attainment``)."""
    served = [not j.rejected and not math.isnan(j.finished) for j in jobs]
    ttfts = np.array([j.ttft if ok else math.inf for j, ok in zip(jobs, served, strict=True)])
    tpots = np.array([j.tpot if ok else math.inf for j, ok in zip(jobs, served, strict=True)])
    requests = len(jobs)
    return Outcome(
        shape=shape,
        attainment=attainment,
        ttft_s=_quantile(ttfts, objectives.attainment),
        tpot_s=_quantile(tpots, objectives.attainment),
        ttft_missed=float(np.mean(ttfts > objectives.ttft_s)) if requests else 0.0,
        tpot_missed=float(np.mean(tpots > objectives.tpot_s)) if requests else 0.0,
        requests=requests,
        rejected=sum(1 for j in jobs if j.rejected),
    )


def _quantile(values: np.ndarray, share: float) -> float:
    """The least value that ``share`` of ``values`` stay within (no interpolation, so an
    infinite value stays infinite instead of making the answer NaN)."""
    if values.size == 0:
        return 0.0
    return float(np.quantile(values, share, method="inverted_cdf"))


class SimulatedCluster:
    """Simulates shapes of one cluster on one workload: owns the records and every setting
    but the node counts, and the objectives the outcomes are measured against."""

    def __init__(
        self, records: Sequence[TraceRecord], base: SimConfig, objectives: Objectives
    ) -> None:
        self.records = records
        self.base = dataclasses.replace(
            base, slo_ttft_s=objectives.ttft_s, slo_tpot_s=objectives.tpot_s
        )
        self.objectives = objectives

    def config(self, shape: Shape) -> SimConfig:
        return dataclasses.replace(
            self.base, prefill_nodes=shape.prefill, decode_nodes=shape.decode
        )

    def __call__(self, shape: Shape) -> Outcome:
        simulation = Simulation(self.config(shape), self.records)
        result = simulation.run()
        return measure(shape, simulation.jobs, self.objectives, result.slo_attainment)
