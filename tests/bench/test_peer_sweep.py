"""bench/peer.py's sweep report: the table's ratios and the plot, from the per-level
comparison files ``crescent bench --compare`` writes."""

from __future__ import annotations

import json
from pathlib import Path

from bench.peer import sweep_summaries, sweep_table
from crescent.bench.plots import sweep_plot

FIGURES = ("request_throughput", "output_throughput", "ttft_p50_ms", "itl_p50_ms")


def write_level(out: Path, level: int, ours: float, peer: float) -> None:
    folder = out / f"c{level}"
    folder.mkdir(parents=True)
    summaries = {
        "crescent": {key: ours * level for key in FIGURES}
        | {"itl_mean_ms": 10.0, "e2e_mean_ms": 1.0},
        "llama-server": {key: peer * level for key in FIGURES}
        | {"itl_mean_ms": 20.0, "e2e_mean_ms": 0.0},
    }
    (folder / "comparison.json").write_text(json.dumps({"summaries": summaries}))


def test_the_table_gives_each_level_both_servers_and_their_ratio(tmp_path: Path) -> None:
    write_level(tmp_path, 1, ours=3.0, peer=2.0)
    write_level(tmp_path, 4, ours=1.0, peer=4.0)
    rows = sweep_table(sweep_summaries(tmp_path, [1, 4])).splitlines()
    assert "| 1 | req/s | 3.00 | 2.00 | 1.50× |" in rows
    assert "| 4 | ITL p50 ms | 4.00 | 16.00 | 0.25× |" in rows
    assert "| 1 | ITL mean ms | 10.00 | 20.00 | 0.50× |" in rows
    assert "| 4 | e2e mean ms | 1.00 | 0.00 | n/a |" in rows


def test_the_plot_has_every_target_over_the_levels(tmp_path: Path) -> None:
    write_level(tmp_path, 1, ours=3.0, peer=2.0)
    write_level(tmp_path, 16, ours=1.0, peer=4.0)
    sweep = sweep_summaries(tmp_path, [1, 16])
    assert set(sweep) == {"crescent", "llama-server"}
    assert sweep["llama-server"][16]["request_throughput"] == 64.0
    sweep_plot(sweep, tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
