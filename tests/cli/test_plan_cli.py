"""``crescent plan`` from the command line: its answer checked by ``crescent sim`` on both sides,
its output, a synthetic workload and its errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from crescent.cli import main

OBJECTIVES = ["--slo-ttft-ms", "10000", "--slo-tpot-ms", "100", "--cost-model", "a800"]
#: The trace's first 3,000 requests at four times its pace (see the acceptance test).
SLICE = ["--num-requests", "3000", "--time-scale", "0.25"]


def run_json(capsys: pytest.CaptureFixture[str], *args: str, status: int = 0) -> dict[str, Any]:
    assert main([*args, "--json"]) == status
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # one object, one line
    found = json.loads(out)
    assert isinstance(found, dict)
    return found


def simulated_attainment(capsys: pytest.CaptureFixture[str], prefill: int, decode: int) -> float:
    shape = ["--prefill-nodes", str(prefill), "--decode-nodes", str(decode)]
    result = run_json(capsys, "sim", *SLICE, *OBJECTIVES, *shape)
    assert (result["slo_ttft_ms"], result["slo_tpot_ms"]) == (10000.0, 100.0)
    attainment = result["slo_attainment"]
    assert isinstance(attainment, float)
    return attainment


def test_the_plan_meets_the_objectives_and_each_smaller_cluster_does_not(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The Mooncake conversation trace, TTFT 10 s and TPOT 100 ms for 90% of requests, A800
    costs: the planned cluster meets them in ``crescent sim``, one prefill node fewer does
    not, one decode node fewer does not.

    A slice at a faster pace keeps the test near half a minute on one core: the trace's
    first 3,000 requests (its first 14 minutes of 59) at four times their pace. They stand
    for the trace: its arrivals and lengths hold steady over the hour (830 to 1,100 requests,
    mean prompts of 10.8k to 14.5k tokens and outputs of 324 to 355 in each 5 minutes), so
    its first minutes load a cluster as the rest do. The faster pace makes both pools count:
    at the trace's own pace one A800 decode node meets 100 ms TPOT, and "one decode node
    fewer" would have no cluster to check."""
    objectives = ["--ttft-slo-ms", "10000", "--tpot-slo-ms", "100", "--attainment", "0.9"]
    planned = run_json(capsys, "plan", *SLICE, *objectives, "--cost-model", "a800")
    best = planned["recommended"]
    assert best is not None and best["meets"]
    prefill, decode = best["prefill_nodes"], best["decode_nodes"]
    assert prefill > 1 and decode > 1  # both smaller clusters exist
    met = simulated_attainment(capsys, prefill, decode)
    assert met >= 0.9
    assert met == pytest.approx(best["attainment"])
    assert simulated_attainment(capsys, prefill - 1, decode) < 0.9
    assert simulated_attainment(capsys, prefill, decode - 1) < 0.9
    told = {(s["prefill_nodes"], s["decode_nodes"]): s for s in planned["smaller"]}
    assert set(told) == {(prefill - 1, decode), (prefill, decode - 1)}
    assert not any(s["meets"] for s in told.values())
    # The pool cut is the pool that misses: TTFT without a prefill node, TPOT without a decode.
    assert "TTFT" in told[(prefill - 1, decode)]["why"]
    assert "TPOT" in told[(prefill, decode - 1)]["why"]
    assert planned["simulations"] <= planned["max_simulations"] and not planned["cut"]


def test_the_text_names_the_answer_its_margin_and_the_failures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["plan", "--num-requests", "300", "--time-scale", "0.5", "--cost-model", "a800"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "Recommended:" in out and "margin" in out
    assert "TTFT at p90" in out and "TPOT at p90" in out
    assert "Next smaller configurations:" in out


def test_a_synthetic_workload(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--rate", "2", "--mix", "2048:128:3,8192:256", "--requests", "400"]
    quiet = run_json(capsys, *args, "--cost-model", "a800")
    busy = run_json(capsys, *args, "--cost-model", "a800", "--rate-multiplier", "4")
    assert quiet["workload"]["source"] == "synthetic"
    assert quiet["workload"]["mean_prompt_tokens"] == pytest.approx((3 * 2048 + 8192) / 4)
    assert quiet["recommended"] is not None and busy["recommended"] is not None
    # Four times the load needs more prefill nodes.
    assert busy["recommended"]["prefill_nodes"] > quiet["recommended"]["prefill_nodes"]


def test_no_cluster_within_the_limits(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--num-requests", "300", "--time-scale", "0.05", "--max-prefill-nodes", "2"]
    found = run_json(capsys, *args, "--max-decode-nodes", "2", status=1)
    assert found["recommended"] is None and found["smaller"] == []
    shapes = [(t["prefill_nodes"], t["decode_nodes"]) for t in found["tried"]]
    assert all(p <= 2 and d <= 2 for p, d in shapes)
    assert 2 in shapes[-1]  # it stopped at a cap
    assert not any(t["meets"] for t in found["tried"])


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--apply"], "needs --live"),
        (["--rate", "3"], "both --rate and --mix"),
        (["--live", "--rate", "3", "--mix", "10:10"], "leave out --rate"),
    ],
)
def test_refused_combinations(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", *args]) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    "bad", [["--attainment", "0"], ["--attainment", "1.5"], ["--mix", "10"], ["--rate", "-1"]]
)
def test_bad_values_are_refused(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["plan", *bad])
    assert exited.value.code == 2
    assert bad[0] in capsys.readouterr().err


def test_a_bad_trace_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 1}\n')
    assert main(["plan", "--trace", str(trace)]) == 2
    assert f"{trace}:1:" in capsys.readouterr().err
