"""The cluster simulator on traces small enough to check by hand: each time to first token and
time per output token follows from the cost model's coefficients, written out here."""

from __future__ import annotations

import math

import pytest

from crescent.sim.cluster import SimConfig, Simulation, simulate
from crescent.sim.costs import cost_model
from crescent.sim.schedulers import SCHEDULERS
from crescent.traces import CONVERSATION_TRACE, TraceRecord, load_trace

A800 = cost_model("a800")
BLOCK = A800.block_tokens
STEP = A800.max_num_batched_tokens


def prefill(tokens: int, cached: int) -> float:
    """Seconds to compute ``tokens`` after ``cached`` ones: a base per chunk of ``STEP``
    tokens, a cost per token, and one per query-key pair."""
    c = A800.prefill
    chunks = -(-tokens // STEP)
    pairs = tokens * (cached + tokens / 2)
    return chunks * c.base_s + c.per_token_s * tokens + c.per_attention_s * pairs


def decode_step(batch: int, context: int) -> float:
    c = A800.decode
    return c.base_s + c.per_token_s * batch + c.per_attention_s * (context + batch / 2)


def handoff(tokens: int) -> float:
    blocks = -(-tokens // BLOCK)
    return A800.pull_overhead_s + blocks * A800.block_bytes / A800.fetch_bandwidth


def run(records: list[TraceRecord], **config: object) -> Simulation:
    sim = Simulation(SimConfig(**config), records)  # type: ignore[arg-type]
    sim.run()
    return sim


TRACE = [
    TraceRecord(0, 3 * BLOCK, 3, (1, 2, 3)),
    TraceRecord(10, 3 * BLOCK - 36, 2, (1, 2, 4)),  # shares two blocks, waits for the first
    TraceRecord(20_000, 100, 1, (9,)),  # one token: no decode
]


def test_one_prefill_node_serves_in_order_and_reuses_what_it_computed() -> None:
    sim = run(TRACE, prefill_nodes=1, decode_nodes=1)
    first, second, third = sim.jobs
    assert first.ttft == pytest.approx(prefill(3 * BLOCK, 0), rel=1e-12)
    # The second waits for the first, then finds blocks 1 and 2 in the pool.
    second_start = first.first_token
    assert second.cached_blocks == 2
    assert second.first_token == pytest.approx(
        second_start + prefill(BLOCK - 36, 2 * BLOCK), rel=1e-12
    )
    assert second.ttft == pytest.approx(second.first_token - 0.010, rel=1e-12)
    assert third.ttft == pytest.approx(prefill(100, 0), rel=1e-12)
    assert math.isnan(third.tpot) is False and third.tpot == 0.0


def test_decode_steps_and_the_handoff_make_the_time_per_output_token() -> None:
    sim = run(TRACE, prefill_nodes=1, decode_nodes=1)
    first, second, _ = sim.jobs
    # The first decodes alone for two steps (its prompt and first token in the KV), then
    # the second joins... but only once it reaches the node, after the first has gone.
    joined = first.first_token + handoff(3 * BLOCK)
    one = decode_step(1, 3 * BLOCK + 1)
    two = decode_step(1, 3 * BLOCK + 2)
    assert first.finished == pytest.approx(joined + one + two, rel=1e-12)
    assert first.tpot == pytest.approx((first.finished - first.first_token) / 2, rel=1e-12)
    second_joined = second.first_token + handoff(3 * BLOCK - 36)
    assert second_joined > first.finished
    assert second.finished == pytest.approx(
        second_joined + decode_step(1, 3 * BLOCK - 36 + 1), rel=1e-12
    )


def test_hit_rate_and_objectives_are_counted_over_the_requests() -> None:
    result = simulate(SimConfig(prefill_nodes=1, decode_nodes=1), TRACE)
    assert result.hit_rate == pytest.approx(2 / 7)
    assert (result.requests, result.completed, result.rejected) == (3, 3, 0)
    assert result.slo_attainment == 1.0
    strict = simulate(SimConfig(prefill_nodes=1, decode_nodes=1, slo_ttft_s=0.2), TRACE)
    ttfts = sorted(j.ttft for j in run(TRACE, prefill_nodes=1, decode_nodes=1).jobs)
    assert strict.slo_attainment == pytest.approx(sum(t <= 0.2 for t in ttfts) / 3)


def test_a_later_request_goes_back_to_the_idle_node_holding_its_prefix() -> None:
    records = [TRACE[0], TraceRecord(5_000, 3 * BLOCK - 36, 2, (1, 2, 4))]
    sim = run(records, prefill_nodes=2, decode_nodes=1)
    first, second = sim.jobs
    assert first.placement is not None and second.placement is not None
    assert second.placement.prefill_node == first.placement.prefill_node
    assert second.placement.pulls == ()
    assert second.ttft == pytest.approx(prefill(BLOCK - 36, 2 * BLOCK), rel=1e-12)


def test_an_idle_node_pulls_the_prefix_its_busy_holder_has() -> None:
    """The holder of blocks 1 and 2 is busy with a long prompt: the other node pulls them
    (decode nodes keep nothing here, or the decode node, which holds them too, could serve)."""
    long_prompt = tuple(range(100, 140))
    records = [
        TRACE[0],
        TraceRecord(5_000, 40 * BLOCK, 2, long_prompt),  # to the holder: lowest id, idle
        TraceRecord(5_100, 3 * BLOCK - 36, 2, (1, 2, 4)),
    ]
    sim = run(records, prefill_nodes=2, decode_nodes=1, decode_pools=False)
    first, busy, third = sim.jobs
    assert first.placement is not None and busy.placement is not None
    assert third.placement is not None
    assert busy.placement.prefill_node == first.placement.prefill_node
    assert third.placement.prefill_node != first.placement.prefill_node
    (pull,) = third.placement.pulls
    assert (pull.node_id, pull.first_block, pull.num_blocks) == (first.placement.prefill_node, 0, 2)
    assert third.cached_blocks == 2
    fetch = A800.pull_overhead_s + 2 * A800.block_bytes / A800.fetch_bandwidth
    assert third.ttft == pytest.approx(fetch + prefill(BLOCK - 36, 2 * BLOCK), rel=1e-12)


def test_time_scale_compresses_arrivals() -> None:
    sim = Simulation(SimConfig(time_scale=0.25), TRACE)
    assert [j.arrival for j in sim.jobs] == [0.0, 0.0025, 5.0]


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_every_scheduler_serves_a_slice_of_the_trace(scheduler: str) -> None:
    records = load_trace(CONVERSATION_TRACE, 150)
    result = simulate(
        SimConfig(scheduler=scheduler, prefill_nodes=4, decode_nodes=2, time_scale=0.5), records
    )
    assert (result.requests, result.completed, result.rejected) == (150, 150, 0)
    assert 0 <= result.hit_rate <= 1
    assert 0 < result.ttft_mean_s <= result.ttft_p99_s
    assert result.placement_p50_ms > 0
