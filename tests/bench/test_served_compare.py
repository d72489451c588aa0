"""The before/after comparison of served.py's figures: medians, spread and ratio."""

from __future__ import annotations

from bench.served_compare import compare, figures


def test_the_comparison_gives_each_figure_its_median_spread_and_ratio() -> None:
    rounds = {
        "before": [{"ttft_s": 0.100}, {"ttft_s": 0.120}, {"ttft_s": 0.110}],
        "after": [{"ttft_s": 0.090}, {"ttft_s": 0.099}, {"ttft_s": 0.130}],
    }
    rounds["after"][1]["kv_handoff"] = 0.01  # in one round only: no row
    [(name, cells)] = compare(rounds)
    assert name == "ttft_s"
    assert cells == ["110.0", "100.0-120.0", "99.0", "90.0-130.0", "0.90"]


def test_figures_take_the_cold_medians_and_the_full_hit_ttft() -> None:
    run = {"ttft_s": 0.2, "itl_s": 0.01, "phases_s": {"queue": 0.001}}
    result = {"cold": [run, run], "hits": [{"ttft_s": 0.05}, {"ttft_s": 0.07}, {"ttft_s": 0.06}]}
    got = figures(result)
    assert got["ttft_s"] == 0.2 and got["queue"] == 0.001 and got["full hit: ttft_s"] == 0.06
