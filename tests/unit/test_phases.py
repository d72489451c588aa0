"""The phase cores: what a decode node and a prefill node time of a request, how the gateway
puts their phases together, and the bounded store behind the debug view."""

from __future__ import annotations

import pytest

from services.gateway.phases import Recent, RequestPhases
from shared import phases
from shared.node.decode_timer import DecodeTimer


def test_a_prefill_node_splits_its_time_into_queue_fetch_and_compute() -> None:
    # Arrived at 10.0, pulled for 0.3 s, first stepped at 10.5, first token at 11.25.
    assert phases.prefill_phases(10.0, 0.3, 10.5, 11.25) == {
        phases.PREFILL_QUEUE: pytest.approx(0.2),
        phases.PREFIX_FETCH: 0.3,
        phases.PREFILL_COMPUTE: pytest.approx(0.75),
    }


def test_a_decode_node_times_the_handoff_the_first_step_and_the_means() -> None:
    timer = DecodeTimer(received_at=1.0)
    timer.running_at = 1.25
    assert timer.output(1.5) == {
        phases.KV_HANDOFF: pytest.approx(0.25),
        phases.FIRST_DECODE_STEP: pytest.approx(0.25),
    }
    timer.sent(0.002)
    assert timer.totals() == {phases.TOKEN_PUBLISH: pytest.approx(0.002)}
    assert timer.output(1.6, step_s=0.05) == {}
    timer.sent(0.004)
    assert timer.output(1.9, step_s=0.15) == {}
    assert timer.totals() == {
        phases.DECODE_STEP: pytest.approx(0.2),  # (1.9 - 1.5) over two gaps
        phases.ENGINE_STEP: pytest.approx(0.1),  # the steps behind those two outputs
        phases.TOKEN_PUBLISH: pytest.approx(0.003),
    }


def test_the_gateway_keeps_the_first_of_each_phase_and_the_last_of_each_mean() -> None:
    timed = RequestPhases()
    timed.gateway(phases.PARSE, 0.001)
    timed.gateway(phases.PLACEMENT, 0.002)
    timed.from_node({phases.PREFILL_QUEUE: 0.01, phases.PREFILL_COMPUTE: 0.1})
    # A resumed attempt's prefill comes later: the first one's figures stand.
    timed.from_node({phases.PREFILL_COMPUTE: 0.9, phases.DECODE_STEP: 0.02})
    timed.from_node({phases.DECODE_STEP: 0.03, "from_a_newer_node": 1.0})
    timed.wrote_event(0.001)
    timed.wrote_event(0.003)
    out = timed.breakdown(ttft_s=0.2, inter_token_s=0.035)
    assert out == {
        phases.PARSE: 0.001,
        phases.PLACEMENT: 0.002,
        phases.PREFILL_QUEUE: 0.01,
        phases.PREFILL_COMPUTE: 0.1,
        phases.DECODE_STEP: 0.03,
        phases.HOPS: pytest.approx(0.2 - 0.001 - 0.002 - 0.01 - 0.1),
        phases.INTER_TOKEN: 0.035,
        phases.SSE_WRITE: pytest.approx(0.002),
    }


def test_the_hops_are_never_negative() -> None:
    assert phases.first_token_hops({phases.PREFILL_COMPUTE: 0.5}, 0.4) == 0.0


def test_the_debug_store_keeps_the_latest_and_shows_each_only_to_its_tenant() -> None:
    recent = Recent(limit=2)
    for i in range(3):
        recent.add(f"r{i}", "alice", {"n": i})
    assert recent.get("r0", "alice") is None  # the oldest went first
    assert recent.get("r2", "alice") == {"n": 2}
    assert recent.get("r2", "bob") is None
    assert len(recent.entries) == 2
