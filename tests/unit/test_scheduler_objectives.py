"""What is left of a request's TTFT objective: its own deadline, the scheduler's, or both."""

from __future__ import annotations

from services.scheduler.objectives import ttft_objective

NOW = 1_800_000_000.0


def test_the_tighter_of_the_request_and_the_scheduler_objective_counts() -> None:
    assert ttft_objective(0.0, None, NOW) is None
    assert ttft_objective(0.0, 2.0, NOW) == 2.0
    assert ttft_objective(NOW + 0.5, None, NOW) == 0.5
    assert ttft_objective(NOW + 0.5, 2.0, NOW) == 0.5
    assert ttft_objective(NOW + 9.0, 2.0, NOW) == 2.0
    # A deadline already passed leaves nothing: no prediction meets it.
    assert ttft_objective(NOW - 1.0, 2.0, NOW) == 0.0
