"""PNG plots of one run or of two side by side: latency CDFs and TTFT over time; and of a
concurrency sweep, each figure against the concurrency.

Figures are drawn on matplotlib's Agg canvas directly (no pyplot, so no GUI backend and no
global figure state).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from crescent.bench.metrics import LATENCIES, latencies_s
from crescent.bench.records import RequestRecord

Series = Mapping[str, Sequence[RequestRecord]]
_TITLES = {
    "ttft": "time to first token",
    "tpot": "time per output token",
    "itl": "inter-token latency",
    "e2e": "end-to-end latency",
}


def latency_cdfs(series: Series, path: Path) -> None:
    """One panel per latency figure, one curve per target."""
    figure = Figure(figsize=(11, 8), layout="constrained")
    axes = figure.subplots(2, 2).flatten()
    values = {name: latencies_s(records) for name, records in series.items()}
    for ax, latency in zip(axes, LATENCIES, strict=True):
        for name, by_latency in values.items():
            ms = np.sort(np.asarray(by_latency[latency], dtype=float) * 1000)
            if ms.size:
                ax.step(ms, np.arange(1, ms.size + 1) / ms.size, where="post", label=name)
        ax.set_title(_TITLES[latency])
        ax.set_xlabel("ms")
        ax.set_ylabel("share of requests" if latency != "itl" else "share of gaps")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(loc="lower right")
    _save(figure, path)


def ttft_over_time(series: Series, path: Path) -> None:
    """TTFT of each completed request against when it was sent."""
    figure = Figure(figsize=(11, 4.5), layout="constrained")
    ax = figure.subplots()
    for name, records in series.items():
        done = [r for r in records if r.ok and r.ttft_s is not None]
        ax.scatter(
            [r.sent_s for r in done],
            [(r.ttft_s or 0.0) * 1000 for r in done],
            s=8,
            alpha=0.6,
            label=name,
        )
    ax.set_title("time to first token over the run")
    ax.set_xlabel("sent at (s from the start of the target's run)")
    ax.set_ylabel("TTFT (ms)")
    ax.grid(alpha=0.3)
    if ax.has_data():
        ax.legend(loc="upper left")
    _save(figure, path)


#: A sweep: per target, per concurrency level, that level's summary figures.
Sweep = Mapping[str, Mapping[int, Mapping[str, float]]]
_SWEEP_PANELS = (
    ("request_throughput", "requests per second", "req/s"),
    ("output_throughput", "output tokens per second", "tok/s"),
    ("ttft_p50_ms", "TTFT, median", "ms"),
    ("itl_p50_ms", "inter-token latency, median", "ms"),
)


def sweep_plot(sweep: Sweep, path: Path) -> None:
    """One panel per figure, each target a line over the concurrency levels it ran."""
    figure = Figure(figsize=(11, 8), layout="constrained")
    axes = figure.subplots(2, 2).flatten()
    ticks = sorted({level for levels in sweep.values() for level in levels})
    for ax, (key, title, unit) in zip(axes, _SWEEP_PANELS, strict=True):
        for name, levels in sweep.items():
            xs = sorted(levels)
            ax.plot(xs, [levels[x][key] for x in xs], marker="o", label=name)
        ax.set_title(title)
        ax.set_xlabel("concurrency")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(level) for level in ticks])
        ax.minorticks_off()
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(loc="best")
    _save(figure, path)


def write_plots(series: Series, folder: Path) -> list[Path]:
    """Both plots under ``folder``; the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / "latency_cdf.png", folder / "ttft_over_time.png"]
    latency_cdfs(series, paths[0])
    ttft_over_time(series, paths[1])
    return paths


def _save(figure: Figure, path: Path) -> None:
    FigureCanvasAgg(figure)
    figure.savefig(path, dpi=110)
