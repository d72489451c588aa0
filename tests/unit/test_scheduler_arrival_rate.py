"""Placements still to come during a request's decode: the placement rate per decode node and
objective (``arrival_rate``), and the lifetime forecast placement checks a request's time
between tokens against (``forecast.tbt_life_s``)."""

from __future__ import annotations

import math

import pytest

from services.scheduler.arrival_rate import ArrivalRates
from services.scheduler.cluster import ClusterView
from services.scheduler.forecast import forecast
from services.scheduler.policy import Rejection, place, record_placement
from services.scheduler.pricing import PlacementRequest
from services.scheduler.timing import StepCoefficients, StepTimes
from tests.unit.scheduler_nodes import NOW, node, placed

COEF = StepCoefficients(base_s=0.01, per_token_s=1e-3, per_attention_s=0.0)
TBT_SLO_S = 0.02  # four running: 15 ms a step with one more


def cluster() -> ClusterView:
    view = ClusterView(3.0, timing=StepTimes(COEF))
    view.update(node("p", "prefill"))
    view.update(node("d", "decode", running_seqs=4))
    return view


def stream(view: ClusterView, per_s: float, seconds: float, tbt_slo_s: float | None) -> None:
    """Placements on "d" at ``per_s`` a second over the ``seconds`` before NOW."""
    count = int(per_s * seconds)
    for k in range(count):
        view.arrival_rates.add("d", NOW - seconds + k / per_s, tbt_slo_s)


def test_a_steady_stream_reads_back_as_its_rate() -> None:
    rates = ArrivalRates(window_s=30.0)
    for k in range(3000):  # 2 a second for 25 minutes: far past the window
        rates.add("d", k / 2, None)
    assert rates.rate("d", 1499.5) == pytest.approx(2.0, rel=0.02)
    assert rates.rate("d", 1499.5 + 30.0) == pytest.approx(2.0 / math.e, rel=0.02)
    assert rates.rate("other", 1499.5) == 0.0
    rates.forget("d")
    assert rates.rate("d", 1499.5) == 0.0


def test_only_placements_under_a_looser_objective_count_against_one() -> None:
    rates = ArrivalRates(window_s=30.0)
    for objective in (None, 0.05, 0.02, 0.01):
        rates.add("d", 0.0, objective)
    scale = 1 / 30.0
    assert rates.rate("d", 0.0) == pytest.approx(4 * scale)
    assert rates.rate("d", 0.0, looser_than=0.02) == pytest.approx(2 * scale)  # 0.05 and none
    assert rates.rate("d", 0.0, looser_than=0.01) == pytest.approx(3 * scale)


def test_placements_under_a_looser_objective_to_come_refuse_a_long_tight_request() -> None:
    long_tight = PlacementRequest(64, 1000, "r", tbt_slo_s=TBT_SLO_S)
    quiet = cluster()
    at_start = forecast(quiet.nodes["d"], quiet, long_tight, NOW)
    assert at_start.tbt_s == pytest.approx(0.015)
    assert at_start.tbt_life_s == at_start.tbt_s  # nothing placed lately: nothing to come
    placed(place(long_tight, quiet, [], NOW, tbt_slo_s=TBT_SLO_S))

    busy = cluster()
    stream(busy, 2.0, 30.0, None)  # two a second, held to no objective
    life = forecast(busy.nodes["d"], busy, long_tight, NOW)
    # About 1.26 a second by the window's weights, over half its 15 s decode: 9 more sequences.
    assert life.tbt_s == pytest.approx(0.015)
    assert life.tbt_life_s == pytest.approx(0.024)
    refused = place(long_tight, busy, [], NOW, tbt_slo_s=TBT_SLO_S)
    assert isinstance(refused, Rejection) and refused.status == 429
    assert refused.cause == "tbt_slo"

    short_tight = PlacementRequest(64, 16, "s", tbt_slo_s=TBT_SLO_S)  # done before they come
    placed(place(short_tight, busy, [], NOW, tbt_slo_s=TBT_SLO_S))


def test_placements_held_to_the_same_objective_do_not_count_against_it() -> None:
    # Each of them is refused itself unless the batch it joins steps in time.
    view = cluster()
    stream(view, 2.0, 30.0, TBT_SLO_S)
    long_tight = PlacementRequest(64, 1000, "r", tbt_slo_s=TBT_SLO_S)
    assert forecast(view.nodes["d"], view, long_tight, NOW).tbt_life_s == pytest.approx(0.015)
    placed(place(long_tight, view, [], NOW, tbt_slo_s=TBT_SLO_S))


def test_placing_a_request_counts_it_in_its_decode_nodes_rate() -> None:
    view = cluster()
    ask = PlacementRequest(64, 16, "r", tbt_slo_s=0.5)
    record_placement(view, placed(place(ask, view, [], NOW)), ask)
    assert view.arrival_rates.rate("d", NOW) == pytest.approx(1 / 30.0)
    assert view.arrival_rates.rate("d", NOW, looser_than=0.5) == 0.0
