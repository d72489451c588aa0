"""Hit rates of tierd's eviction policies and of the offline optimum on one global pool, by
capacity: the cache side of ``crescent sim``, reproducible with

    .venv/bin/python -m crescent.sim.hitrate --capacities 1000,10000,30000,50000,100000,inf \\
        --policies lru,lfu,recompute,crescent,belady [--workload trace|shared-prefix|...] \\
        [--param crescent.half_life_s=300] [--json]

A hit is a block found as part of a request's cached prefix; the hit rate is hits ÷ blocks
requested. ``--measure seconds`` weighs each hit by the recompute time it saves instead (the
share of all prefill recompute seconds saved, by tierd's default ``RecomputeModel``).
``oracle-returns`` and ``oracle-class-age`` are references, not policies: the first knows
whether each block is asked for again but not when, the second each read count's exact times
to the next request but nothing of one block (``oracles``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from crescent.sim.belady import OptimalPool
from crescent.sim.oracles import ClassAgeOraclePool, ReturnOraclePool
from crescent.sim.pool import BlockPool, HitCounters
from crescent.sim.synthetic import WORKLOADS
from crescent.traces import CONVERSATION_TRACE, TraceRecord, load_trace
from services.tierd.policy import POLICIES, RecomputeModel, make_policy

OPTIMUM = "belady"
PLAIN_LRU = "plain-lru"
#: The optimum with ties in next use broken toward the shallower block (a worse bound).
SHALLOW_TIES = "belady-shallower"
#: Knows whether each block is asked for again, not when.
RETURN_ORACLE = "oracle-returns"
#: Knows how soon blocks of each read count come back, not which do.
CLASS_AGE_ORACLE = "oracle-class-age"
POLICY_NAMES = (*POLICIES, OPTIMUM, PLAIN_LRU, SHALLOW_TIES, RETURN_ORACLE, CLASS_AGE_ORACLE)
DEFAULT_POLICIES = (*POLICIES, OPTIMUM)
DEFAULT_CAPACITIES = "1000,10000,30000,50000,100000,inf"


class PlainLru(HitCounters):
    """The textbook LRU over block ids, blind to prefixes: it evicts a chain's head as readily
    as its tail, one block as each id past capacity is stored. Not one of tierd's policies: the
    independent replay that the pool's prefix-aware LRU is checked against (``plain-lru``)."""

    def __init__(self, capacity_blocks: int | None) -> None:
        super().__init__()
        self.capacity_blocks = capacity_blocks
        self._order: OrderedDict[int, None] = OrderedDict()

    def access(self, hash_ids: Sequence[int], now: float = 0.0) -> int:
        order = self._order
        hits = next((i for i, h in enumerate(hash_ids) if h not in order), len(hash_ids))
        self._count(hits, len(hash_ids))
        for hash_id in hash_ids:
            order[hash_id] = None
            order.move_to_end(hash_id)
            if self.capacity_blocks is not None and len(order) > self.capacity_blocks:
                order.popitem(last=False)
                self.evictions += 1
        return hits


@dataclass(frozen=True, slots=True)
class HitRate:
    """One policy's result at one capacity (None: unlimited)."""

    policy: str
    capacity_blocks: int | None
    hits: float  # blocks, or recompute seconds with ``measure="seconds"``
    requested: float
    replay_s: float = 0.0  # wall-clock seconds the replay took

    @property
    def hit_rate(self) -> float:
        return self.hits / self.requested if self.requested else 0.0


def _weights(measure: str, longest: int) -> list[float]:
    """Cumulative weight of the first ``n`` blocks of a prompt, for n = 0..longest."""
    if measure == "hits":
        return [float(n) for n in range(longest + 1)]
    if measure != "seconds":
        raise ValueError(f"unknown measure {measure!r}: hits or seconds")
    model = RecomputeModel()
    out = [0.0]
    for depth in range(longest):
        out.append(out[-1] + model.seconds(depth))
    return out


def replay(
    records: Sequence[TraceRecord],
    policy: str,
    capacity_blocks: int | None,
    measure: str = "hits",
    params: Mapping[str, float] | None = None,
    history_per_block: int | None = None,
) -> HitRate:
    """Serves ``records`` in order through a pool of ``policy`` (or the optimum), the policy
    built with ``params``; the pool remembers the use of ``history_per_block`` dropped blocks
    per block of capacity (None: the pool's default)."""
    started = time.perf_counter()
    requests = [r.hash_ids for r in records]
    weight = _weights(measure, max((len(ids) for ids in requests), default=0))
    pool: BlockPool | OptimalPool | PlainLru | ReturnOraclePool | ClassAgeOraclePool
    if policy in (OPTIMUM, SHALLOW_TIES):
        pool = OptimalPool(requests, capacity_blocks, deeper_first=policy == OPTIMUM)
    elif policy == RETURN_ORACLE:
        pool = ReturnOraclePool(requests, capacity_blocks)
    elif policy == CLASS_AGE_ORACLE:
        times = [r.timestamp_ms / 1000 for r in records]
        pool = ClassAgeOraclePool(requests, times, capacity_blocks)
    elif policy == PLAIN_LRU:
        pool = PlainLru(capacity_blocks)
    else:
        history = None
        if history_per_block is not None and capacity_blocks is not None:
            history = history_per_block * capacity_blocks
        policy_object = make_policy(policy, **(params or {}))
        pool = BlockPool(capacity_blocks, policy_object, history_blocks=history)
    hits = requested = 0.0
    for record, ids in zip(records, requests, strict=True):
        found = pool.access(ids, record.timestamp_ms / 1000)
        hits += weight[found]
        requested += weight[len(ids)]
    return HitRate(policy, capacity_blocks, hits, requested, time.perf_counter() - started)


def hit_rates(
    records: Sequence[TraceRecord],
    policy_names: Iterable[str],
    capacities: Iterable[int | None],
    measure: str = "hits",
    progress: Progress | None = None,
    params: Mapping[str, Mapping[str, float]] | None = None,
    history_per_block: int | None = None,
) -> list[HitRate]:
    """Every policy at every capacity, policies outer; ``params`` by policy name."""
    runs = [(p, c) for p in policy_names for c in capacities]
    task = progress.add_task("replaying", total=len(runs)) if progress else None
    out: list[HitRate] = []
    for policy, capacity in runs:
        policy_params = (params or {}).get(policy)
        out.append(replay(records, policy, capacity, measure, policy_params, history_per_block))
        if progress is not None and task is not None:
            progress.advance(task)
    return out


def gap_closed(rows: Iterable[HitRate], policy: str, baseline: str = "lru") -> dict[str, float]:
    """By capacity label: the share of the baseline-to-optimum gap ``policy`` closes (absent
    where the table lacks either, or the gap is nil)."""
    rate = {(r.policy, label(r.capacity_blocks)): r.hit_rate for r in rows}
    out: dict[str, float] = {}
    for (name, cap), value in rate.items():
        low, high = rate.get((baseline, cap)), rate.get((OPTIMUM, cap))
        if name == policy and low is not None and high is not None and high - low > 1e-9:
            out[cap] = (value - low) / (high - low)
    return out


def label(capacity: int | None) -> str:
    if capacity is None:
        return "inf"
    return f"{capacity // 1000}K" if capacity >= 1000 and capacity % 1000 == 0 else str(capacity)


def parse_capacities(text: str) -> list[int | None]:
    out: list[int | None] = []
    for part in text.split(","):
        part = part.strip().lower()
        out.append(None if part in ("inf", "unlimited", "none") else int(part))
    return out


def parse_params(items: Iterable[str]) -> dict[str, dict[str, float]]:
    """``POLICY.NAME=VALUE`` items as parameters by policy; ValueError on a malformed one."""
    out: dict[str, dict[str, float]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        policy, dot, name = key.partition(".")
        if not (sep and dot and policy and name):
            raise ValueError(f"--param {item!r}: expected POLICY.NAME=VALUE")
        try:
            out.setdefault(policy, {})[name] = float(value)
        except ValueError:
            raise ValueError(f"--param {item!r}: {value!r} is not a number") from None
    return out


def markdown_table(rows: Sequence[HitRate]) -> str:
    """Policies as rows, capacities as columns, and the share of the LRU-to-optimum gap each
    policy closes where both are in the table."""
    capacities = list(dict.fromkeys(label(r.capacity_blocks) for r in rows))
    policies = list(dict.fromkeys(r.policy for r in rows))
    rate = {(r.policy, label(r.capacity_blocks)): r.hit_rate for r in rows}
    lines = [
        "| policy | " + " | ".join(capacities) + " |",
        "|---|" + "---:|" * len(capacities),
    ]
    for policy in policies:
        cells = [f"{rate[(policy, c)]:.4f}" if (policy, c) in rate else "" for c in capacities]
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    for policy in policies:
        gaps = gap_closed(rows, policy)
        if policy not in ("lru", OPTIMUM, PLAIN_LRU, SHALLOW_TIES) and gaps:
            cells = [f"{gaps[c]:.0%}" if c in gaps else "" for c in capacities]
            lines.append(f"| {policy}: gap closed | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def load_records(args: argparse.Namespace) -> list[TraceRecord]:
    if args.workload == "trace":
        return load_trace(args.trace, args.limit)
    records = WORKLOADS[args.workload](seed=args.seed)
    return records[: args.limit] if args.limit is not None else records


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m crescent.sim.hitrate",
        description="Hit rates of eviction policies and the offline optimum by pool capacity.",
    )
    parser.add_argument("--workload", choices=["trace", *WORKLOADS], default="trace")
    parser.add_argument("--trace", type=Path, default=CONVERSATION_TRACE)
    parser.add_argument("--limit", type=int, default=None, help="first N requests only")
    parser.add_argument("--seed", type=int, default=0, help="for the synthetic workloads")
    parser.add_argument("--capacities", default=DEFAULT_CAPACITIES, help="blocks; inf: none")
    parser.add_argument(
        "--policies",
        default=",".join(DEFAULT_POLICIES),
        help=f"any of {','.join(POLICY_NAMES)}",
    )
    parser.add_argument("--measure", choices=["hits", "seconds"], default="hits")
    parser.add_argument(
        "--history-per-block",
        type=int,
        default=None,
        metavar="N",
        help="dropped blocks whose use the pool remembers, per block of capacity (default 4)",
    )
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="POLICY.NAME=VALUE",
        help="a policy parameter, e.g. crescent.cost_weight=0.25 (repeatable)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICY_NAMES]
    if unknown:
        parser.error(f"unknown policies {unknown}; choose from {list(POLICY_NAMES)}")
    capacities = parse_capacities(args.capacities)
    try:
        params = parse_params(args.param)
    except ValueError as exc:
        parser.error(str(exc))
    records = load_records(args)
    with Progress(console=Console(stderr=True), transient=True) as progress:
        rows = hit_rates(
            records, policies, capacities, args.measure, progress, params, args.history_per_block
        )
    if args.json:
        print(json.dumps(to_json(args, records, rows)))
    else:
        print(markdown_table(rows))
    return 0


def to_json(
    args: argparse.Namespace, records: Sequence[TraceRecord], rows: list[HitRate]
) -> dict[str, object]:
    return {
        "workload": args.workload if args.workload != "trace" else str(args.trace),
        "requests": len(records),
        "blocks_requested": sum(len(r.hash_ids) for r in records),
        "measure": args.measure,
        "params": parse_params(args.param),
        "history_per_block": args.history_per_block,
        "hit_rate": {
            p: {label(r.capacity_blocks): r.hit_rate for r in rows if r.policy == p}
            for p in dict.fromkeys(r.policy for r in rows)
        },
        "replay_s": {
            p: {label(r.capacity_blocks): round(r.replay_s, 3) for r in rows if r.policy == p}
            for p in dict.fromkeys(r.policy for r in rows)
        },
        "gap_closed": {
            p: gap_closed(rows, p) for p in dict.fromkeys(r.policy for r in rows) if p != OPTIMUM
        },
    }


if __name__ == "__main__":
    sys.exit(main())
