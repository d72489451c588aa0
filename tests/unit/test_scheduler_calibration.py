"""Measured misses of the TTFT predictions stretch what objectives are checked against."""

from __future__ import annotations

from services.scheduler.calibration import HIGHEST, MIN_SAMPLES, TtftCalibration


def test_predictions_are_taken_as_they_are_until_enough_samples() -> None:
    cal = TtftCalibration()
    cal.add("p0", [(1.0, 2.0)] * (MIN_SAMPLES - 1))
    assert cal.scale("p0") == 1.0 and cal.scale("unknown") == 1.0


def test_the_scale_is_a_high_quantile_of_the_ratios_within_bounds() -> None:
    cal = TtftCalibration()
    cal.add("p0", [(1.0, 1.0 + i / 20) for i in range(20)])  # ratios 1.0 .. 1.95
    assert cal.scale("p0") == 1.95
    cal.add("p1", [(0.1, 10.0)] * 10)
    assert cal.scale("p1") == HIGHEST
    cal.add("p2", [(0.001, 5.0)] * 10 + [(0.0, 1.0)] * 10)  # too short to tell anything
    assert cal.scale("p2") == 1.0
    cal.forget("p0")
    assert cal.scale("p0") == 1.0
