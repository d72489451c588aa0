"""``crescent sim`` from the command line: its JSON output, its options, its errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crescent.cli import main
from crescent.sim.cli import SCHEDULERS

SMALL = ["sim", "--num-requests", "40", "--prefill-nodes", "2", "--decode-nodes", "1"]
KEYS = {
    "hit_rate",
    "ttft_mean_s",
    "ttft_p90_s",
    "slo_attainment",
    "requests",
    "wall_s",
    "requests_per_wall_s",
    "placement_p50_ms",
    "placement_p99_ms",
}


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert main([*SMALL, *args, "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # one object, one line
    found = json.loads(out)
    assert isinstance(found, dict)
    return found


def test_json_has_the_figures(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_json(capsys, "--scheduler", "round-robin", "--cost-model", "local")
    assert result.keys() >= KEYS
    assert result["requests"] == 40
    assert result["scheduler"] == "round-robin"
    assert result["cost_model"] == "local"
    assert result["slo_ttft_ms"] == 2000.0  # the local model's default objective


def test_options_reach_the_simulation(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_json(
        capsys,
        "--rate-multiplier", "4",
        "--capacity-blocks", "inf",
        "--policy", "lfu",
        "--slo-ttft-ms", "1500",
        "--slo-tpot-ms", "50",
    )  # fmt: skip
    assert result["time_scale"] == 0.25
    assert result["capacity_blocks"] is None
    assert result["policy"] == "lfu"
    assert (result["slo_ttft_ms"], result["slo_tpot_ms"]) == (1500.0, 50.0)


def test_every_scheduler_in_one_run(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_json(capsys, "--scheduler", "all")
    runs = result["runs"]
    assert isinstance(runs, list)
    assert [r["scheduler"] for r in runs] == list(SCHEDULERS)
    assert all(r.keys() >= KEYS for r in runs)


def test_a_table_without_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SMALL, "--scheduler", "load"]) == 0
    out = capsys.readouterr().out
    assert "load" in out and "TTFT" in out


def test_a_bad_trace_line_is_an_error_with_its_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    good = '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}'
    trace.write_text(f'{good}\n{{"timestamp": 1}}\n')
    assert main(["sim", "--trace", str(trace)]) == 2
    assert f"{trace}:2:" in capsys.readouterr().err


@pytest.mark.parametrize(
    "bad", [["--prefill-nodes", "0"], ["--time-scale", "-1"], ["--capacity-blocks", "-5"]]
)
def test_bad_values_are_refused(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*SMALL, *bad])
    assert exited.value.code == 2
    assert bad[0] in capsys.readouterr().err


def test_rate_and_scale_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*SMALL, "--time-scale", "0.5", "--rate-multiplier", "2"])
    assert exited.value.code == 2
    assert "not allowed with" in capsys.readouterr().err
