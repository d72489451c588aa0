"""The bench's figures on fixed timings, checked against numbers worked out by hand."""

from __future__ import annotations

import pytest

from crescent.bench.metrics import (
    Slo,
    attainment_at,
    is_good,
    latency_stats,
    ratios,
    required_scale,
    summarize,
    tightest_scale,
    tpot_s,
)
from crescent.bench.records import RequestRecord


def _done(
    ttft: float,
    e2e: float,
    tokens: int,
    gaps: list[float],
    prompt: int = 100,
    cached: int | None = None,
    tiers: dict[str, int] | None = None,
) -> RequestRecord:
    return RequestRecord(
        index=0,
        conversation=0,
        turn=0,
        scheduled_s=0.0,
        sent_s=0.0,
        prompt_len=prompt,
        max_tokens=tokens,
        ok=True,
        status=200,
        ttft_s=ttft,
        e2e_s=e2e,
        itl_s=gaps,
        output_tokens=tokens,
        prompt_tokens=prompt,
        cached_tokens=cached,
        cached_by_tier=tiers,
    )


def _failed() -> RequestRecord:
    return RequestRecord(0, 0, 0, 0.0, 0.0, 50, 4, status=503, error="overloaded")


RECORDS = [
    # TPOT (1.1 - 0.1) / 4 = 0.25 s: too slow for a 200 ms TPOT objective.
    _done(0.1, 1.1, 5, [0.2, 0.3, 0.25, 0.25], cached=0, tiers={"dram": 0}),
    # TPOT (0.6 - 0.3) / 3 = 0.1 s; 60 of 100 prompt tokens cached, 40 in DRAM, 20 on NVMe.
    _done(0.3, 0.6, 4, [0.1, 0.1, 0.1], cached=60, tiers={"dram": 40, "nvme": 20, "s3": 0}),
    # One token: no TPOT, no gap; a 2 s TTFT misses a 1 s objective. No cache report at all.
    _done(2.0, 2.0, 1, []),
    _failed(),
]
SLO = Slo(ttft_ms=1000, tpot_ms=200)


def test_tpot_and_the_slo_of_each_request() -> None:
    assert [tpot_s(r) for r in RECORDS] == pytest.approx([0.25, 0.1, None, None])
    assert [is_good(r, SLO) for r in RECORDS] == [False, True, False, False]
    assert is_good(RECORDS[0], Slo(1000, 250))  # the objective itself is met
    assert is_good(RECORDS[2], Slo(2000, 1))  # no TPOT: only TTFT counts


def test_each_requests_required_scale_and_the_tightest_scale_held() -> None:
    # TTFT 0.1 / 1 s and TPOT 0.25 / 0.2 s: 1.25; 0.3 and 0.5: 0.5; 2.0 (no TPOT): 2; failed.
    needed = [required_scale(r, SLO) for r in RECORDS]
    assert needed == pytest.approx([1.25, 0.5, 2.0, float("inf")])
    assert attainment_at(sorted(needed), 1.0) == 0.25  # the goodput's own share
    assert attainment_at(sorted(needed), 2.0) == 0.75
    # 90% of 4 requests is all 4: the failed one can never meet it.
    assert tightest_scale(RECORDS, SLO) == float("inf")
    assert tightest_scale(RECORDS, SLO, attainment=0.75) == pytest.approx(2.0)
    assert tightest_scale(RECORDS[:3], SLO, attainment=0.5) == pytest.approx(1.25)
    assert tightest_scale([], SLO) is None
    # At its required scale a request is good; a hair tighter, it is not.
    for record, scale in zip(RECORDS[:3], needed, strict=False):
        assert is_good(record, Slo(SLO.ttft_ms * scale, SLO.tpot_ms * scale))
        assert not is_good(record, Slo(SLO.ttft_ms * scale * 0.99, SLO.tpot_ms * scale * 0.99))


def test_summary_on_fixed_timings() -> None:
    s = summarize(RECORDS, duration_s=4.0, slo=SLO)
    assert (s["requests"], s["completed"], s["failed"]) == (4, 3, 1)
    assert s["request_throughput"] == pytest.approx(0.75)
    assert s["output_throughput"] == pytest.approx(10 / 4)
    assert s["goodput"] == pytest.approx(0.25)
    assert s["slo_attainment"] == pytest.approx(0.25)
    assert s["prompt_tokens"] == 300 and s["output_tokens"] == 10
    # TTFT over 0.1, 0.3, 2.0 s: mean 0.8 s; p50 0.3 s; p90 0.3 + 0.8 * 1.7 = 1.66 s.
    assert s["ttft_mean_ms"] == pytest.approx(800)
    assert s["ttft_p50_ms"] == pytest.approx(300)
    assert s["ttft_p90_ms"] == pytest.approx(1660)
    assert s["ttft_p99_ms"] == pytest.approx(1966)
    assert s["tpot_mean_ms"] == pytest.approx(175)
    assert s["tpot_p50_ms"] == pytest.approx(175)
    # Seven gaps pooled: 0.1 x3, 0.2, 0.25 x2, 0.3.
    assert s["itl_mean_ms"] == pytest.approx(1300 / 7)
    assert s["itl_p50_ms"] == pytest.approx(200)
    assert s["itl_p90_ms"] == pytest.approx(270)
    assert s["e2e_mean_ms"] == pytest.approx(3700 / 3)
    # Cached ratios count only the requests that reported them.
    assert s["cached_ratio"] == pytest.approx(60 / 200)
    assert s["cached_ratio_dram"] == pytest.approx(40 / 200)
    assert s["cached_ratio_nvme"] == pytest.approx(20 / 200)
    assert s["cached_ratio_s3"] == 0


def test_nothing_reported_is_none_not_zero() -> None:
    s = summarize([_done(0.5, 0.5, 1, []), _failed()], duration_s=2.0, slo=SLO)
    assert s["cached_ratio"] is None and s["cached_ratio_dram"] is None
    assert s["tpot_mean_ms"] is None and s["itl_p99_ms"] is None
    assert s["ttft_mean_ms"] == pytest.approx(500)
    empty = summarize([], duration_s=0.0, slo=SLO)
    assert empty["requests"] == 0 and empty["slo_attainment"] is None


def test_latency_stats_names_its_figures() -> None:
    assert latency_stats("x", [0.001, 0.003]) == pytest.approx(
        {"x_mean_ms": 2.0, "x_p50_ms": 2.0, "x_p90_ms": 2.8, "x_p99_ms": 2.98}
    )


def test_ratios_are_b_over_a() -> None:
    a = {"goodput": 2.0, "ttft_mean_ms": 400.0, "cached_ratio": 0.0, "tpot_mean_ms": None}
    b = {"goodput": 5.0, "ttft_mean_ms": 100.0, "cached_ratio": 0.5, "tpot_mean_ms": 3.0}
    assert ratios(a, b) == {
        "goodput": 2.5,
        "ttft_mean_ms": 0.25,
        "cached_ratio": None,
        "tpot_mean_ms": None,
    }
