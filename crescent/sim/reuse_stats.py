"""How the blocks of a trace come back: what any eviction policy has to go on.

    .venv/bin/python -m crescent.sim.reuse_stats [--trace FILE | --workload NAME] [--json]

For every block request: whether the same block is requested again later, and after how long,
grouped by how often the block had been requested before (what a policy can count) and, for
first sightings, by what a policy can see of a new block: its depth in the prompt, whether it
ends the prompt, and how many of the prompt's leading blocks were seen before (a prompt whose
first two or more blocks were seen continues an earlier one, as a conversation's next turn).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from crescent.sim.synthetic import WORKLOADS
from crescent.traces import CONVERSATION_TRACE, TraceRecord, load_trace

_DEPTHS = (1, 3, 7, 15, 31, 63, 127)  # upper bounds of the depth groups
#: (times requested before, depth, the prompt's length, its leading blocks seen before) to
#: (order, name) of the block request's group, or None to leave it out.
Key = Callable[[int, int, int, int], "tuple[int, str] | None"]


@dataclass(frozen=True, slots=True)
class ReturnGroup:
    """Block requests of one kind, and how many of them were followed by another request for
    the same block, with the gaps (seconds) to it."""

    group: str
    requests: int
    returned: int
    gap_p10_s: float | None
    gap_p50_s: float | None
    gap_p90_s: float | None


def _group(name: str, gaps: list[float], requests: int) -> ReturnGroup:
    q = statistics.quantiles(gaps, n=10) if len(gaps) >= 2 else None
    return ReturnGroup(
        name,
        requests,
        len(gaps),
        *((round(q[0], 1), round(q[4], 1), round(q[8], 1)) if q else (None, None, None)),
    )


def return_groups(records: Sequence[TraceRecord], key: Key) -> list[ReturnGroup]:
    """Groups of block requests by ``key`` (see ``Key``)."""
    seen: Counter[int] = Counter()
    events: list[tuple[int, float, tuple[int, str] | None]] = []
    for record in records:
        t = record.timestamp_ms / 1000
        ids = record.hash_ids
        leading = next((i for i, h in enumerate(ids) if h not in seen), len(ids))
        for depth, hash_id in enumerate(ids):
            events.append((hash_id, t, key(seen[hash_id], depth, len(ids), leading)))
            seen[hash_id] += 1
    upcoming: dict[int, float] = {}
    requests: Counter[tuple[int, str]] = Counter()
    gaps: dict[tuple[int, str], list[float]] = {}
    for hash_id, t, name in reversed(events):
        later = upcoming.get(hash_id)
        upcoming[hash_id] = t
        if name is None:
            continue
        requests[name] += 1
        bucket = gaps.setdefault(name, [])
        if later is not None:
            bucket.append(later - t)
    return [_group(name[1], gaps[name], requests[name]) for name in sorted(requests)]


def by_reads(before: int, depth: int, length: int, leading: int) -> tuple[int, str]:
    return (before, f"seen {before} times before") if before < 4 else (4, "seen 4+ times before")


def by_prompt(before: int, depth: int, length: int, leading: int) -> tuple[int, str] | None:
    if before:
        return None
    if depth == length - 1:
        return (3, "new, last block of its prompt")
    if leading >= 2:
        return (2, "new, the prompt's first 2+ blocks seen")
    return (leading, "new, the prompt's first block seen" if leading else "new, a new prompt")


def by_first_depth(before: int, depth: int, length: int, leading: int) -> tuple[int, str] | None:
    if before:
        return None
    for i, bound in enumerate(_DEPTHS):
        if depth <= bound:
            low = _DEPTHS[i - 1] + 1 if i else 0
            return (i, f"new, depth {low}-{bound}")
    return (len(_DEPTHS), f"new, depth {_DEPTHS[-1] + 1}+")


def summary(records: Sequence[TraceRecord]) -> dict[str, object]:
    blocks = sum(len(r.hash_ids) for r in records)
    distinct = len({h for r in records for h in r.hash_ids})
    span_s = (records[-1].timestamp_ms - records[0].timestamp_ms) / 1000 if records else 0.0
    return {
        "requests": len(records),
        "blocks_requested": blocks,
        "distinct_blocks": distinct,
        "first_sightings_share": distinct / blocks if blocks else 0.0,
        "span_s": span_s,
        "blocks_per_s": blocks / span_s if span_s else 0.0,
        "by_reads": [asdict(g) for g in return_groups(records, by_reads)],
        "by_first_depth": [asdict(g) for g in return_groups(records, by_first_depth)],
        "by_prompt": [asdict(g) for g in return_groups(records, by_prompt)],
    }


def _print(report: dict[str, object]) -> None:
    for key in ("requests", "blocks_requested", "distinct_blocks"):
        print(f"{key}: {report[key]}")
    print(f"first sightings: {report['first_sightings_share']:.1%} of block requests")
    print(f"{report['blocks_per_s']:.1f} blocks/s over {report['span_s']:.0f} s")
    for section in ("by_reads", "by_first_depth", "by_prompt"):
        print(f"\n| {section} | requests | returned | gap p10 | p50 | p90 |")
        print("|---|---:|---:|---:|---:|---:|")
        for g in report[section]:  # type: ignore[attr-defined]
            share = g["returned"] / g["requests"]
            gaps = " | ".join("" if g[k] is None else f"{g[k]} s" for k in _GAP_KEYS)
            print(f"| {g['group']} | {g['requests']} | {share:.1%} | {gaps} |")


_GAP_KEYS = ("gap_p10_s", "gap_p50_s", "gap_p90_s")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m crescent.sim.reuse_stats")
    parser.add_argument("--workload", choices=["trace", *WORKLOADS], default="trace")
    parser.add_argument("--trace", type=Path, default=CONVERSATION_TRACE)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.workload == "trace":
        records = load_trace(args.trace, args.limit)
    else:
        records = WORKLOADS[args.workload]()[: args.limit]
    report = summary(records)
    if args.json:
        print(json.dumps(report))
    else:
        _print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
