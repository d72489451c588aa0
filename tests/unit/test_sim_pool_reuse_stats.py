"""How blocks come back, counted on the hand-checked trace."""

from __future__ import annotations

import json

import pytest

from crescent.sim.reuse_stats import (
    by_first_depth,
    by_prompt,
    by_reads,
    main,
    return_groups,
    summary,
)
from crescent.traces import TraceRecord
from tests.unit.sim_traces import HAND_TRACE


def _records() -> list[TraceRecord]:
    return [
        TraceRecord(t * 10_000, 512 * len(ids), 1, tuple(ids)) for t, ids in enumerate(HAND_TRACE)
    ]


def test_returns_by_times_seen_before() -> None:
    # Block 1 is asked for at 0, 10, 20, 30 and 40 s; 2 at 0, 20, 40; 3 at 0, 40; 4 at 10,
    # 30; 5 at 20 only.
    groups = {g.group: (g.requests, g.returned) for g in return_groups(_records(), by_reads)}
    assert groups == {
        "seen 0 times before": (5, 4),  # all but 5 come back
        "seen 1 times before": (4, 2),  # 1 and 2 again; 3 and 4 not
        "seen 2 times before": (2, 1),
        "seen 3 times before": (1, 1),
        "seen 4+ times before": (1, 0),
    }
    first = return_groups(_records(), by_reads)[0]
    assert first.gap_p50_s == 20.0  # gaps 10 (block 1), 20 (2), 40 (3), 20 (4)


def test_new_blocks_by_depth_and_the_summary() -> None:
    groups = {g.group: g for g in return_groups(_records(), by_first_depth)}
    assert groups["new, depth 0-1"].requests == 3  # 1, 2 and 4
    assert groups["new, depth 2-3"].requests == 2  # 3 and 5
    report = summary(_records())
    assert report["blocks_requested"] == 13 and report["distinct_blocks"] == 5
    assert report["first_sightings_share"] == pytest.approx(5 / 13)


def test_new_blocks_by_what_their_prompt_shows() -> None:
    # [1, 2, 3] is all new; [1, 4] and [1, 2, 5] only add their last block.
    groups = {g.group: (g.requests, g.returned) for g in return_groups(_records(), by_prompt)}
    assert groups == {
        "new, a new prompt": (2, 2),  # 1 and 2, both back
        "new, last block of its prompt": (3, 2),  # 3 and 4 come back, 5 does not
    }
    turns = [[1, 2], [1, 3, 4], [1, 3, 5, 6], [1, 3, 5, 7]]
    records = [TraceRecord(t * 1000, 2048, 1, tuple(ids)) for t, ids in enumerate(turns)]
    groups = {g.group: (g.requests, g.returned) for g in return_groups(records, by_prompt)}
    assert groups == {
        "new, a new prompt": (1, 1),  # 1
        "new, the prompt's first block seen": (1, 1),  # 3, after 1
        "new, the prompt's first 2+ blocks seen": (1, 1),  # 5, after 1 and 3
        "new, last block of its prompt": (4, 0),  # 2, 4, 6 and 7
    }


def test_main_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--limit", "100", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["requests"] == 100 and report["by_reads"][0]["group"] == "seen 0 times before"
    assert main(["--workload", "multi-turn", "--limit", "50"]) == 0
    assert "| by_reads |" in capsys.readouterr().out
