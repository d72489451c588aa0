"""The hit-rate table of ``python -m crescent.sim.hitrate``: what it replays, the share of
the LRU-to-optimum gap, and its text and JSON output."""

from __future__ import annotations

import json

import pytest

from crescent.sim.hitrate import (
    HitRate,
    gap_closed,
    hit_rates,
    label,
    main,
    markdown_table,
    parse_capacities,
    parse_params,
    replay,
)
from crescent.sim.synthetic import shared_prefix_workload
from crescent.traces import TraceRecord
from tests.unit.sim_traces import HAND_BELADY_HITS, HAND_CAPACITY, HAND_LRU_HITS, HAND_TRACE


def _hand_records() -> list[TraceRecord]:
    return [
        TraceRecord(t * 1000, 512 * len(ids), 1, tuple(ids)) for t, ids in enumerate(HAND_TRACE)
    ]


def test_replay_counts_the_hand_checked_hits() -> None:
    records = _hand_records()
    lru = replay(records, "lru", HAND_CAPACITY)
    optimum = replay(records, "belady", HAND_CAPACITY)
    assert (lru.hits, lru.requested) == (sum(HAND_LRU_HITS), 13)
    assert optimum.hits == sum(HAND_BELADY_HITS)
    # Weighed by recompute time, a hit on a deeper block counts for more than one on a
    # shallow block, so the share differs from the block count's.
    seconds = replay(records, "lru", HAND_CAPACITY, measure="seconds")
    assert 0 < seconds.hit_rate < 1 and seconds.hit_rate != pytest.approx(lru.hit_rate)
    with pytest.raises(ValueError, match="measure"):
        replay(records, "lru", 3, measure="bytes")


def test_gap_closed_is_the_share_between_lru_and_the_optimum() -> None:
    rows = [
        HitRate("lru", 10, 10, 100),
        HitRate("crescent", 10, 25, 100),
        HitRate("belady", 10, 40, 100),
        HitRate("lru", None, 50, 100),
        HitRate("crescent", None, 50, 100),
        HitRate("belady", None, 50, 100),  # no gap at all: no share
    ]
    assert gap_closed(rows, "crescent") == {"10": pytest.approx(0.5)}
    table = markdown_table(rows)
    assert table.splitlines()[0] == "| policy | 10 | inf |"
    assert "| crescent | 0.2500 | 0.5000 |" in table
    assert "| crescent: gap closed | 50% |  |" in table


def test_capacities_parse_and_label() -> None:
    assert parse_capacities("1000, 10000,inf,unlimited") == [1000, 10000, None, None]
    assert [label(c) for c in (1000, 30_000, 1500, None)] == ["1K", "30K", "1500", "inf"]


def test_the_optimum_bounds_every_policy_in_the_table() -> None:
    records = shared_prefix_workload(250, prompts=20, seed=1)
    names = ["lru", "lfu", "recompute", "crescent", "oracle-returns", "oracle-class-age", "belady"]
    rows = hit_rates(records, names, [50, 400])
    best = {r.capacity_blocks: r.hit_rate for r in rows if r.policy == "belady"}
    assert all(r.hit_rate <= best[r.capacity_blocks] + 1e-12 for r in rows)
    assert len(rows) == 14


def test_main_prints_json_and_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--workload", "multi-turn", "--limit", "300", "--capacities", "100,inf"]
    assert main([*argv, "--policies", "lru,belady", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["requests"] == 300 and out["measure"] == "hits"
    assert set(out["replay_s"]["belady"]) == {"100", "inf"}
    assert set(out["hit_rate"]) == {"lru", "belady"}
    assert set(out["hit_rate"]["lru"]) == {"100", "inf"}
    assert out["hit_rate"]["lru"]["inf"] == pytest.approx(out["hit_rate"]["belady"]["inf"])
    assert main([*argv, "--policies", "lru,crescent,belady"]) == 0
    assert "| crescent: gap closed |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--policies", "fifo"])


def test_main_reads_the_conversation_trace(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--limit", "200", "--capacities", "100", "--policies", "lru", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["requests"] == 200 and out["workload"].endswith("conversation_trace.jsonl.gz")
    assert 0 < out["hit_rate"]["lru"]["100"] < 1


def test_policy_parameters_reach_the_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_params(["crescent.cost_weight=0.25", "crescent.half_life_s=5"]) == {
        "crescent": {"cost_weight": 0.25, "half_life_s": 5.0}
    }
    for bad in ("crescent=1", "crescent.cost_weight", ".x=1", "crescent.cost_weight=high"):
        with pytest.raises(ValueError, match="--param"):
            parse_params([bad])
    records = shared_prefix_workload(300, prompts=20, seed=2)
    default = replay(records, "crescent", 60)
    quick = replay(records, "crescent", 60, params={"half_life_s": 0.5})
    assert quick.hit_rate != default.hit_rate
    with pytest.raises(TypeError):
        replay(records, "lru", 60, params={"half_life_s": 5})
    argv = ["--workload", "shared-prefix", "--limit", "50", "--capacities", "20"]
    assert (
        main([*argv, "--policies", "crescent", "--param", "crescent.half_life_s=9", "--json"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["params"] == {"crescent": {"half_life_s": 9.0}}
    with pytest.raises(SystemExit):
        main([*argv, "--param", "nonsense"])


def test_the_pool_s_memory_of_dropped_blocks_is_an_option(
    capsys: pytest.CaptureFixture[str],
) -> None:
    records = shared_prefix_workload(300, prompts=20, seed=2)
    remembering = replay(records, "crescent", 60)
    forgetting = replay(records, "crescent", 60, history_per_block=0)
    assert remembering.hit_rate != forgetting.hit_rate
    # LRU never looks at counts: what the pool remembers changes nothing.
    lru = replay(records, "lru", 60)
    assert replay(records, "lru", 60, history_per_block=0).hits == lru.hits
    argv = ["--workload", "shared-prefix", "--limit", "50", "--capacities", "20", "--json"]
    assert main([*argv, "--policies", "lru", "--history-per-block", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["history_per_block"] == 2
