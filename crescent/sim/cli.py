"""The command line of ``crescent sim``: a simulated cluster replaying a trace, placed by the live
scheduler's code. Only argparse here; the simulator is imported when a run starts.

    crescent sim --scheduler cost --prefill-nodes 16 --decode-nodes 16 --time-scale 0.5 --json
    crescent sim --scheduler all --cost-model a800 --time-scale 0.5
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from crescent.traces import CONVERSATION_TRACE

SCHEDULERS = ("random", "round-robin", "load", "cache-aware", "cost")
POLICIES = ("lru", "lfu", "recompute", "crescent")
COST_MODELS = ("a800", "local")
_SHOWN = (
    ("scheduler", "scheduler", "{}"),
    ("hit_rate", "hits", "{:.3f}"),
    ("ttft_mean_s", "TTFT s", "{:.2f}"),
    ("ttft_p90_s", "p90 s", "{:.2f}"),
    ("tpot_mean_s", "TPOT ms", "{:.1f}"),
    ("slo_attainment", "SLO met", "{:.1%}"),
    ("requests_per_wall_s", "req/s", "{:,.0f}"),
    ("placement_p99_ms", "place p99 ms", "{:.3f}"),
)


def _capacity(text: str) -> int | None:
    if text.lower() in ("inf", "none", "unlimited"):
        return None
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be a number of blocks, or inf")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be positive")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", type=Path, default=CONVERSATION_TRACE, help="Mooncake trace")
    parser.add_argument(
        "--num-requests", type=_count, default=None, help="replay the first N (None: all)"
    )
    parser.add_argument(
        "--scheduler", choices=(*SCHEDULERS, "all"), default="cost", help="all: each in turn"
    )
    parser.add_argument("--policy", choices=POLICIES, default="lru", help="pools' eviction")
    parser.add_argument(
        "--capacity-blocks", type=_capacity, default=4000, help="each node's pool, or inf"
    )
    parser.add_argument("--prefill-nodes", type=_count, default=16)
    parser.add_argument("--decode-nodes", type=_count, default=16)
    parser.add_argument("--no-decode-pools", action="store_true", help="decode nodes keep no KV")
    parser.add_argument("--cost-model", choices=COST_MODELS, default="a800")
    pace = parser.add_mutually_exclusive_group()
    pace.add_argument(
        "--time-scale", type=_positive, default=None, help="arrival times x this (None: 1)"
    )
    pace.add_argument("--rate-multiplier", type=_positive, default=None, help="= 1 / time scale")
    parser.add_argument(
        "--slo-ttft-ms", type=_positive, default=None, help="None: the cost model's"
    )
    parser.add_argument(
        "--slo-tpot-ms", type=_positive, default=None, help="None: the cost model's"
    )
    parser.add_argument("--seed", type=int, default=0, help="for the random scheduler")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")


def _time_scale(args: argparse.Namespace) -> float:
    if args.rate_multiplier is not None:
        return float(1 / args.rate_multiplier)
    return 1.0 if args.time_scale is None else float(args.time_scale)


def run(args: argparse.Namespace) -> int:
    from crescent.sim.cluster import SimConfig, simulate
    from crescent.traces import TraceError, load_trace

    try:
        records = load_trace(args.trace, args.num_requests)
    except TraceError as exc:
        sys.stderr.write(f"crescent sim: error: {exc}\n")
        return 2
    names = SCHEDULERS if args.scheduler == "all" else (args.scheduler,)
    results = []
    for name in names:
        config = SimConfig(
            prefill_nodes=args.prefill_nodes,
            decode_nodes=args.decode_nodes,
            capacity_blocks=args.capacity_blocks,
            policy=args.policy,
            scheduler=name,
            cost_model=args.cost_model,
            time_scale=_time_scale(args),
            slo_ttft_s=None if args.slo_ttft_ms is None else args.slo_ttft_ms / 1000,
            slo_tpot_s=None if args.slo_tpot_ms is None else args.slo_tpot_ms / 1000,
            seed=args.seed,
            decode_pools=not args.no_decode_pools,
        )
        results.append(simulate(config, records).to_json())
    if args.json:
        out: dict[str, Any] = results[0] if len(results) == 1 else {"runs": results}
        print(json.dumps(out))
    else:
        _print_table(results)
    return 0


def _print_table(results: Sequence[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    first = results[0]
    table = Table(
        title=(
            f"{first['requests']} requests, {first['prefill_nodes']} prefill + "
            f"{first['decode_nodes']} decode nodes, {first['cost_model']} costs, time scale "
            f"{first['time_scale']:g}, SLO TTFT {first['slo_ttft_ms']:g} ms / TPOT "
            f"{first['slo_tpot_ms']:g} ms"
        )
    )
    for _, title, _ in _SHOWN:
        table.add_column(title, justify="left" if title == "scheduler" else "right")
    for result in results:
        row = []
        for key, _, shape in _SHOWN:
            value = result[key] * 1000 if key == "tpot_mean_s" else result[key]
            row.append(shape.format(value))
        table.add_row(*row)
    Console().print(table)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="crescent sim", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
