"""Workloads of the bench: datasets, arrival times, rounds, and the options they come from."""

from __future__ import annotations

import argparse
import itertools
import json
import math
from pathlib import Path

import pytest

from crescent.bench.options import (
    PacingOptions,
    WorkloadOptions,
    add_arguments,
    api_base,
    options_from,
    parse_target,
)
from crescent.bench.workload import arrival_times, build, split_rounds
from crescent.traces import prompt_for, scaled

ALL_AT_ONCE = PacingOptions(math.inf, False, 1.0, 0)
# Conversation (1, 2) has three turns, (1, 5) two; (7,) is a one-block request of its own.
TRACE = [
    (0, [1, 2], 40),
    (1000, [1, 5], 600),
    (2000, [1, 2, 3], 100),
    (2500, [7], 512),
    (4000, [1, 2, 3, 4], 10),
    (5000, [1, 5, 6], 1),
]


def _trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    lines = [
        json.dumps(
            {"timestamp": ts, "input_length": 512 * len(ids), "output_length": out, "hash_ids": ids}
        )
        for ts, ids, out in TRACE
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _workload(trace: Path, dataset: str, n: int = 100, **kw: object) -> WorkloadOptions:
    fields: dict[str, object] = {
        "dataset": dataset,
        "trace": trace,
        "block_tokens": 16,
        "num_requests": n,
        "seed": 0,
        "input_len": 20,
        "output_len": 5,
        "prefix_len": 48,
        "num_prefixes": 3,
        "max_tokens_cap": None,
    }
    return WorkloadOptions(**(fields | kw))  # type: ignore[arg-type]


def test_multiturn_groups_turns_and_scales_prompts_and_outputs(tmp_path: Path) -> None:
    conversations = build(_workload(_trace(tmp_path), "multiturn"), ALL_AT_ONCE)
    assert [[r.index for r in c] for c in conversations] == [[0, 2, 4], [1, 5], [3]]
    assert [[r.turn for r in c] for c in conversations] == [[0, 1, 2], [0, 1], [0]]
    first, second, third = conversations[0]
    assert second.prompt[: len(first.prompt)] == first.prompt
    assert third.prompt[: len(second.prompt)] == second.prompt
    assert len(third.prompt) == 64
    assert [r.max_tokens for r in conversations[1]] == [scaled(600, 16), 1] == [19, 1]


def test_multiturn_takes_whole_conversations_up_to_n_requests(tmp_path: Path) -> None:
    conversations = build(_workload(_trace(tmp_path), "multiturn", n=4), ALL_AT_ONCE)
    assert [[r.index for r in c] for c in conversations] == [[0, 2, 3], [1]]
    # Indices and arrivals follow the trace's order over the chosen requests alone.
    pacing = PacingOptions(math.inf, True, 1.0, 0)
    timed = build(_workload(_trace(tmp_path), "multiturn", n=4), pacing)
    assert [[r.arrival_s for r in c] for c in timed] == [[0, 2, 4], [1]]


def test_trace_sends_every_record_alone_in_order(tmp_path: Path) -> None:
    workload = _workload(_trace(tmp_path), "trace", n=4, max_tokens_cap=2)
    conversations = build(workload, ALL_AT_ONCE)
    assert [len(c) for c in conversations] == [1, 1, 1, 1]
    assert [c[0].index for c in conversations] == [0, 1, 2, 3]
    assert all(c[0].max_tokens <= 2 for c in conversations)


def test_timestamps_replay_the_trace_scaled(tmp_path: Path) -> None:
    pacing = PacingOptions(math.inf, True, 0.5, 0)
    conversations = build(_workload(_trace(tmp_path), "trace"), pacing)
    assert [c[0].arrival_s for c in conversations] == [0, 0.5, 1.0, 1.25, 2.0, 2.5]


def test_poisson_arrivals_are_seeded_and_have_the_rate() -> None:
    pacing = PacingOptions(4.0, False, 1.0, 0)
    times = arrival_times(4000, pacing, seed=1)
    assert times == arrival_times(4000, pacing, seed=1)
    assert times != arrival_times(4000, pacing, seed=2)
    assert times[0] == 0 and all(b >= a for a, b in itertools.pairwise(times))
    assert times[-1] / 3999 == pytest.approx(0.25, rel=0.1)
    assert arrival_times(3, ALL_AT_ONCE, seed=0) == [0, 0, 0]


def test_shared_prefix_groups_share_exactly_their_prefix(tmp_path: Path) -> None:
    conversations = build(_workload(tmp_path / "unused", "shared-prefix", n=7), ALL_AT_ONCE)
    prompts = [c[0].prompt for c in conversations]
    assert all(len(p) == 48 + 20 for p in prompts)
    assert prompts[0][:48] == prompts[3][:48] == prompts[6][:48]
    assert prompts[0][:48] != prompts[1][:48]
    assert len({p[48:] for p in prompts}) == 7
    assert all(c[0].max_tokens == 5 for c in conversations)


def test_random_prompts_are_fresh_and_follow_the_seed(tmp_path: Path) -> None:
    a = build(_workload(tmp_path / "unused", "random", n=5), ALL_AT_ONCE)
    b = build(_workload(tmp_path / "unused", "random", n=5, seed=9), ALL_AT_ONCE)
    assert len({c[0].prompt[:16] for c in a}) == 5
    assert all(len(c[0].prompt) == 20 for c in a)
    assert [c[0].prompt for c in a] != [c[0].prompt for c in b]


def test_rounds_keep_conversations_whole_and_start_at_zero(tmp_path: Path) -> None:
    pacing = PacingOptions(math.inf, True, 1.0, 0)
    conversations = build(_workload(_trace(tmp_path), "multiturn"), pacing)
    rounds = split_rounds(conversations, 2)
    assert [[c[0].conversation for c in r] for r in rounds] == [[0], [1, 2]]
    assert [min(t.arrival_s for c in r for t in c) for r in rounds] == [0, 0]
    assert rounds[1][0][1].arrival_s == 4.0  # 5 s in the trace, 1 s after the round's first
    singles = build(_workload(_trace(tmp_path), "trace"), ALL_AT_ONCE)
    quarters = split_rounds(singles, 4)
    assert sorted(len(r) for r in quarters) == [1, 1, 2, 2]
    assert [c[0].index for r in quarters for c in r] == [0, 1, 2, 3, 4, 5]
    assert len(split_rounds(singles, 50)) == 6


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_targets_and_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    monkeypatch.setenv("OTHER_KEY", "other")
    opts = options_from(_args("--base-url", "http://h:1/", "--model", "m"))
    assert [t.describe() for t in opts.targets] == [
        {
            "name": "default",
            "base_url": "http://h:1/v1",
            "model": "m",
            "api_key_set": True,
            "cache_off": False,
        }
    ]
    assert opts.targets[0].api_key == "from-env"
    assert not opts.send_slos and options_from(_args("--send-slos")).send_slos
    a, b = options_from(
        _args(
            "--compare",
            "--target",
            "on=http://h:1/v1",
            "--target",
            "off=http://h:1,model=x,key_env=OTHER_KEY,cache=off",
        )
    ).targets
    assert (a.name, a.cache_off, a.api_key) == ("on", False, "from-env")
    assert (b.base_url, b.model, b.api_key, b.cache_off) == ("http://h:1/v1", "x", "other", True)
    assert api_base("http://h:1/v1/") == "http://h:1/v1"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--compare"], "two or more"),
        (["--target", "a=http://x", "--target", "b=http://y"], "needs --compare"),
        (["--compare", "--target", "a=http://x", "--target", "a=http://y"], "must differ"),
        (["--dataset", "random", "--timestamps"], "needs a trace dataset"),
        (["--request-rate", "0"], "above 0"),
        (["--num-requests", "0"], "--num-requests must be at least 1"),
    ],
)
def test_bad_options_are_refused(argv: list[str], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        options_from(_args(*argv))


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("nourl", "is not NAME=URL"),
        ("a=http://x,colour=red", "is not one of"),
        ("a=http://x,cache=maybe", "on or off"),
        ("a=http://x,key_env=CRESCENT_BENCH_UNSET_VARIABLE", "is unset"),
    ],
)
def test_bad_targets_are_refused(spec: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_target(spec, None)


def test_prompts_match_the_trace_module(tmp_path: Path) -> None:
    from crescent.traces import load_trace

    records = load_trace(_trace(tmp_path))
    conversations = build(_workload(_trace(tmp_path), "trace"), ALL_AT_ONCE)
    assert [c[0].prompt for c in conversations] == [prompt_for(r, 16) for r in records]
