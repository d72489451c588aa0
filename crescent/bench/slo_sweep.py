"""DistServe's measure across request rates: one run per rate, each target's goodput and the
tightest objective scale at which 90% of the requests meet both objectives, a table with the
ratios to the first target, ``sweep.json`` and ``slo_sweep.png``.

The scales need no run of their own: a request's required scale (``metrics.required_scale``)
says at which multiples of the objectives it is good, so one run per rate gives the whole
attainment curve.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import ScalarFormatter
from rich.table import Table

from crescent.bench.metrics import ATTAINMENT_TARGET, Slo, Summary, attainment_at, needed_scales
from crescent.bench.options import BenchOptions
from crescent.bench.records import RequestRecord
from crescent.bench.report import cell

#: Per rate, per target: that run's records.
RateRecords = Mapping[float, Mapping[str, Sequence[RequestRecord]]]
#: Per rate, per target: that run's summary (``metrics.summarize``).
RateSummaries = Mapping[float, Mapping[str, Summary]]
#: Per rate, per target: the figures a sweep reports.
RateFigures = dict[float, dict[str, dict[str, float | int | None]]]
#: The figures of a run's summary that a sweep reports.
SUMMARY_KEYS = ("goodput", "slo_attainment", "tightest_scale_p90")


def figures(
    summaries: RateSummaries, records_by_rate: RateRecords, slo: Slo, scales: Sequence[float]
) -> RateFigures:
    """Per rate and target: the run's goodput (req/s), attainment at the objectives as given
    and tightest scale met by 90%, and the attainment at each of ``scales``."""
    out: RateFigures = {}
    for rate, by_target in records_by_rate.items():
        out[rate] = {}
        for name, records in by_target.items():
            needed = needed_scales(records, slo)
            row = {key: summaries[rate][name][key] for key in SUMMARY_KEYS}
            row |= {f"attainment_at_{s:g}x": attainment_at(needed, s) for s in scales}
            out[rate][name] = row
    return out


def table(sweep: RateFigures, slo: Slo) -> Table:
    """One row per rate: each target's goodput and tightest scale, then each other target's
    ratio to the first (goodput: higher is better; scale: lower is tighter, better)."""
    names = list(next(iter(sweep.values()), {}))
    title = (
        f"goodput and the tightest objective scale met by {ATTAINMENT_TARGET:.0%} "
        f"(objectives at 1×: TTFT {slo.ttft_ms:g} ms, TPOT {slo.tpot_ms:g} ms)"
    )
    t = Table(title=title)
    t.add_column("rate (req/s)", justify="right")
    for name in names:
        t.add_column(f"{name} goodput", justify="right")
        t.add_column(f"{name} scale", justify="right")
    for name in names[1:]:
        t.add_column(f"goodput {names[0]} / {name}", justify="right")
        t.add_column(f"scale {name} / {names[0]}", justify="right")
    for rate, by_target in sorted(sweep.items()):
        cells = [f"{rate:g}"]
        for name in names:
            row = by_target[name]
            cells += [cell(row["goodput"], "{:.3f}"), cell(row["tightest_scale_p90"], "{:.2f}×")]
        first = by_target[names[0]]
        for name in names[1:]:
            cells.append(_ratio(first["goodput"], by_target[name]["goodput"]))
            cells.append(_ratio(first["tightest_scale_p90"], by_target[name]["tightest_scale_p90"]))
        t.add_row(*cells)
    return t


def _ratio(numerator: float | int | None, denominator: float | int | None) -> str:
    """``numerator / denominator`` as a factor: ∞ over a finite value is ∞, a finite value
    over ∞ is 0, missing or 0 below is —."""
    if numerator is None or denominator is None or denominator == 0:
        return "—"
    if math.isinf(numerator) and math.isinf(denominator):
        return "—"
    return cell(numerator / denominator, "{:.2f}×")


def plot(records_by_rate: RateRecords, sweep: RateFigures, slo: Slo, path: Path) -> None:
    """Three panels: goodput against the rate, the tightest scale against the rate (each
    target a line), and the attainment against the objective scale (a line per target and
    rate)."""
    figure = Figure(figsize=(15, 4.8), layout="constrained")
    by_rate, by_scale, curves = figure.subplots(1, 3)
    rates = sorted(sweep)
    names = list(sweep[rates[0]]) if rates else []
    for name in names:
        goodput = [sweep[r][name]["goodput"] or 0.0 for r in rates]
        by_rate.plot(rates, goodput, marker="o", label=name)
        held = [(r, sweep[r][name]["tightest_scale_p90"]) for r in rates]
        finite = [(r, s) for r, s in held if s is not None and s < math.inf]
        by_scale.plot([r for r, _ in finite], [s for _, s in finite], marker="o", label=name)
    by_rate.set(title="goodput", xlabel="request rate (req/s)", ylabel="good requests / s")
    by_scale.set(
        title=f"tightest objective scale met by {ATTAINMENT_TARGET:.0%}",
        xlabel="request rate (req/s)",
        ylabel="× the objectives (lower is tighter)",
    )
    by_scale.set_yscale("log", base=2)
    by_scale.yaxis.set_major_formatter(ScalarFormatter())
    for rate in rates:
        for name, records in records_by_rate[rate].items():
            needed = needed_scales(records, slo)
            xs = [s for s in needed if s < math.inf]
            ys = [(i + 1) / len(needed) for i in range(len(xs))]
            curves.step(xs, ys, where="post", label=f"{name} @ {rate:g}/s")
    curves.axhline(ATTAINMENT_TARGET, color="grey", linestyle=":", linewidth=1)
    curves.axvline(1.0, color="grey", linestyle=":", linewidth=1)
    curves.set(
        title=f"attainment (1× = TTFT {slo.ttft_ms:g} ms, TPOT {slo.tpot_ms:g} ms)",
        xlabel="objective scale",
        ylabel="share of requests meeting it",
        ylim=(0, 1.02),
    )
    curves.set_xscale("log", base=2)
    for ax in (by_rate, by_scale, curves):
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(loc="best", fontsize="small")
    FigureCanvasAgg(figure)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def rate_folder(opts: BenchOptions, rate: float) -> Path:
    return opts.out / f"rate-{rate:g}"
