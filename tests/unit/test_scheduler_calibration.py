"""Measured misses of the TTFT predictions stretch what objectives are checked against."""

from __future__ import annotations

from services.scheduler.calibration import HIGHEST, MAX_AGE_S, MIN_SAMPLES, TtftCalibration


def test_predictions_are_taken_as_they_are_until_enough_samples() -> None:
    cal = TtftCalibration()
    cal.add("p0", [(1.0, 2.0)] * (MIN_SAMPLES - 1), 0.0)
    assert cal.scale("p0") == 1.0 and cal.scale("unknown") == 1.0


def test_the_scale_is_a_high_quantile_of_the_ratios_within_bounds() -> None:
    cal = TtftCalibration()
    cal.add("p0", [(1.0, 1.0 + i / 20) for i in range(20)], 0.0)  # ratios 1.0 .. 1.95
    assert cal.scale("p0") == 1.95
    cal.add("p1", [(0.1, 10.0)] * 10, 0.0)
    assert cal.scale("p1") == HIGHEST
    cal.add("p2", [(0.001, 5.0)] * 10 + [(0.0, 1.0)] * 10, 0.0)  # too short to tell anything
    assert cal.scale("p2") == 1.0
    cal.forget("p0")
    assert cal.scale("p0") == 1.0


def test_a_node_refused_everything_is_taken_at_its_predictions_once_its_ratios_age_out() -> None:
    """A stretch past the objective admits nothing, so no new ratio comes: without ageing
    the node would stay refused after its busy spell ended."""
    cal = TtftCalibration()
    cal.add("p0", [(0.1, 10.0)] * MIN_SAMPLES, 0.0)
    cal.add("p0", [], MAX_AGE_S - 1)  # heartbeats with no tasks keep the ratios a while
    assert cal.scale("p0") == HIGHEST
    cal.add("p0", [], MAX_AGE_S + 1)
    assert cal.scale("p0") == 1.0
    cal.add("p0", [(1.0, 2.0)] * MIN_SAMPLES, MAX_AGE_S + 2)  # still slow: stretched anew
    assert cal.scale("p0") == 2.0
