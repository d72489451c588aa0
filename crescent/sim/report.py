"""What one simulation run measured: latencies of the requests, objectives met, cache hits, and
how fast the simulator and the scheduler's calls ran."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from crescent.sim.cluster import Simulation


@dataclass(frozen=True, slots=True)
class SimResult:
    """Figures of one run; times in seconds unless named ``_ms``. ``slo_attainment``: the
    share of all requests (refused ones count as missed) whose TTFT and TPOT both met their
    objectives; ``hit_rate``: blocks found as a cached prefix ÷ blocks requested;
    ``prefill_busy``: the share of the prefill nodes' time spent pulling and computing, from
    the first arrival to the last first token; ``placement_cpu_s``: CPU time of the
    scheduler's calls, ``pool_s``: wall-clock time of the pools' accesses, both within
    ``wall_s``."""

    scheduler: str
    cost_model: str
    policy: str
    prefill_nodes: int
    decode_nodes: int
    capacity_blocks: int | None
    time_scale: float
    requests: int
    completed: int
    rejected: int
    hit_rate: float
    ttft_mean_s: float
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    tpot_mean_s: float
    tpot_p90_s: float
    slo_ttft_ms: float
    slo_tpot_ms: float
    slo_attainment: float
    prefill_busy: float
    simulated_s: float
    wall_s: float
    requests_per_wall_s: float
    placement_p50_ms: float
    placement_p99_ms: float
    placement_cpu_s: float
    pool_s: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _stats(values: Sequence[float], quantiles: Sequence[float]) -> list[float]:
    if not values:
        return [math.nan] * (len(quantiles) + 1)
    array = np.asarray(values)
    return [float(array.mean()), *(float(np.quantile(array, q)) for q in quantiles)]


def summarize(sim: Simulation, hit_rate: float, wall_s: float) -> SimResult:
    config, cost = sim.config, sim.cost
    slo_ttft = cost.slo_ttft_s if config.slo_ttft_s is None else config.slo_ttft_s
    slo_tpot = cost.slo_tpot_s if config.slo_tpot_s is None else config.slo_tpot_s
    done = [j for j in sim.jobs if not j.rejected and not math.isnan(j.finished)]
    ttft_mean, ttft_p50, ttft_p90, ttft_p99 = _stats([j.ttft for j in done], (0.5, 0.9, 0.99))
    tpots = [j.tpot for j in done if j.output_tokens > 1]
    tpot_mean, tpot_p90 = _stats(tpots, (0.9,))
    met = sum(1 for j in done if j.ttft <= slo_ttft and j.tpot <= slo_tpot)
    place_p50, place_p99 = _stats(sim.placement_s, (0.5, 0.99))[1:]
    requests = len(sim.jobs)
    span = max((j.first_token for j in done), default=0.0)
    busy = sim.prefill_busy_s / (config.prefill_nodes * span) if span > 0 else 0.0
    return SimResult(
        scheduler=config.scheduler,
        cost_model=config.cost_model,
        policy=config.policy,
        prefill_nodes=config.prefill_nodes,
        decode_nodes=config.decode_nodes,
        capacity_blocks=config.capacity_blocks,
        time_scale=config.time_scale,
        requests=requests,
        completed=len(done),
        rejected=sum(1 for j in sim.jobs if j.rejected),
        hit_rate=hit_rate,
        ttft_mean_s=ttft_mean,
        ttft_p50_s=ttft_p50,
        ttft_p90_s=ttft_p90,
        ttft_p99_s=ttft_p99,
        tpot_mean_s=tpot_mean,
        tpot_p90_s=tpot_p90,
        slo_ttft_ms=slo_ttft * 1000,
        slo_tpot_ms=slo_tpot * 1000,
        slo_attainment=met / requests if requests else 0.0,
        prefill_busy=busy,
        simulated_s=max((j.finished for j in done), default=0.0),
        wall_s=wall_s,
        requests_per_wall_s=requests / wall_s if wall_s > 0 else math.inf,
        placement_p50_ms=place_p50 * 1000,
        placement_p99_ms=place_p99 * 1000,
        placement_cpu_s=sum(sim.placement_s),
        pool_s=sim.pool_s,
    )
