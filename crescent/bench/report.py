"""The bench's outputs other than plots: result and comparison files, the summary table."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from crescent.bench.metrics import LATENCIES, TIERS, Summary
from crescent.bench.records import RequestRecord

_STATS = ("mean", "p50", "p90", "p99")
#: (summary key, label, format) in the order the table shows them.
ROWS: tuple[tuple[str, str, str], ...] = (
    ("completed", "requests completed", "{:.0f}"),
    ("failed", "requests failed", "{:.0f}"),
    ("duration_s", "wall time (s)", "{:.1f}"),
    ("request_throughput", "throughput (req/s)", "{:.3f}"),
    ("output_throughput", "output throughput (tok/s)", "{:.1f}"),
    ("goodput", "goodput (req/s)", "{:.3f}"),
    ("slo_attainment", "SLO attainment", "{:.1%}"),
    ("tightest_scale_p90", "tightest SLO scale met by 90%", "{:.2f}×"),
    *(
        (f"{name}_{stat}_ms", f"{name.upper()} {stat} (ms)", "{:.1f}")
        for name in LATENCIES
        for stat in _STATS
    ),
    ("cached_ratio", "cached-token ratio", "{:.1%}"),
    *((f"cached_ratio_{tier}", f"  of which {tier}", "{:.1%}") for tier in TIERS),
)


def jsonable(value: Any) -> Any:
    """``value`` with dataclasses as dicts, paths as strings and non-finite floats as
    strings, so that the file is strict JSON."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def write_json(path: Path, payload: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(jsonable(payload), indent=1, allow_nan=False) + "\n")


def write_result(
    path: Path,
    config: Mapping[str, Any],
    summary: Summary,
    records: Sequence[RequestRecord],
) -> None:
    write_json(path, {"config": config, "summary": summary, "requests": list(records)})


def summary_table(
    title: str, summaries: Mapping[str, Summary], ratios: Mapping[str, Summary] | None = None
) -> Table:
    """One column per target, then one per ratio (``"B/A"``: B's figure over A's)."""
    table = Table(title=title)
    table.add_column("figure")
    for name in summaries:
        table.add_column(name, justify="right")
    ratios = ratios or {}
    for label in ratios:
        table.add_column(label.replace("/", " / "), justify="right")
    for key, label, fmt in ROWS:
        cells = [cell(s.get(key), fmt) for s in summaries.values()]
        if all(c == "—" for c in cells):
            continue  # a figure no server reported (cached tokens by tier, say)
        for ratio in ratios.values():
            value = ratio.get(key)
            cells.append("—" if value is None else f"{value:.2f}×")
        table.add_row(label, *cells)
    return table


def cell(value: float | int | None, fmt: str) -> str:
    """A figure as a table shows it: — when missing, ∞ for an infinite scale."""
    if value == math.inf:
        return "∞"  # a tightest scale: more than the rest of the requests failed
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return fmt.format(value)
