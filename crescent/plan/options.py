"""The flags of ``crescent plan``. Only argparse here; the planner is imported when it runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from crescent.plan.scale import DECODE_SET, NAMESPACE, PREFILL_SET
from crescent.sim.cli import COST_MODELS, POLICIES, SCHEDULERS
from crescent.traces import CONVERSATION_TRACE


def _number(
    cast: Callable[[str], float], low: float, high: float | None = None, *, above: bool = False
) -> Callable[[str], float]:
    """A flag's type: ``cast`` of the text, at least ``low`` (above it, with ``above``) and at
    most ``high``."""

    def parse(text: str) -> float:
        value = cast(text)
        if value < low or (above and value == low) or (high is not None and value > high):
            most = "" if high is None else f", at most {high:g}"
            raise argparse.ArgumentTypeError(
                f"must be {'above' if above else 'at least'} {low:g}{most}"
            )
        return value

    return parse


_above_zero = _number(float, 0, above=True)


def _blocks(text: str) -> int | None:
    if text.lower() in ("inf", "none", "unlimited"):
        return None
    return int(_number(int, 0)(text))


def _mix(text: str) -> object:
    from crescent.plan.workload import parse_mix

    try:
        return parse_mix(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    count = _number(int, 1)
    work = parser.add_argument_group("workload (a trace by default)")
    work.add_argument("--trace", type=Path, default=CONVERSATION_TRACE, help="Mooncake trace")
    work.add_argument("--num-requests", type=count, default=None, help="its first N (None: all)")
    work.add_argument(
        "--rate",
        type=_above_zero,
        default=None,
        help="a synthetic workload instead: requests per second (needs --mix)",
    )
    work.add_argument(
        "--mix", type=_mix, default=None, help="its lengths: PROMPT:OUTPUT[:WEIGHT],... in tokens"
    )
    work.add_argument(
        "--shared-share",
        type=_number(float, 0, 1),
        default=0.0,
        help="share of each synthetic prompt that every request shares",
    )
    work.add_argument("--requests", type=count, default=2000, help="synthetic or live requests")
    work.add_argument("--seed", type=int, default=0, help="of the synthetic arrivals")
    pace = work.add_mutually_exclusive_group()
    pace.add_argument("--time-scale", type=_above_zero, default=None, help="arrivals x this")
    pace.add_argument("--rate-multiplier", type=_above_zero, default=None, help="1 / time scale")
    sim = parser.add_argument_group("the simulated cluster (as crescent sim)")
    sim.add_argument(
        "--cost-model", choices=COST_MODELS, default=None, help="None: a800, local with --live"
    )
    sim.add_argument("--scheduler", choices=SCHEDULERS, default="cost")
    sim.add_argument("--policy", choices=POLICIES, default="lru", help="pools' eviction")
    sim.add_argument("--capacity-blocks", type=_blocks, default=4000, help="each pool, or inf")
    sim.add_argument("--no-decode-pools", action="store_true", help="decode nodes keep no KV")
    goal = parser.add_argument_group("objectives and search")
    for latency in ("ttft", "tpot"):
        # Also spelt as crescent sim spells it, so a line moves between the two commands.
        goal.add_argument(
            f"--{latency}-slo-ms",
            f"--slo-{latency}-ms",
            type=_above_zero,
            default=None,
            help="None: the cost model's",
        )
    goal.add_argument(
        "--attainment",
        type=_number(float, 0, 1, above=True),
        default=0.9,
        help="share of requests that must meet both",
    )
    goal.add_argument("--max-prefill-nodes", type=count, default=64)
    goal.add_argument("--max-decode-nodes", type=count, default=64)
    goal.add_argument("--max-simulations", type=count, default=40)
    live = parser.add_argument_group("live: the workload a running cluster serves")
    live.add_argument("--live", action="store_true", help="plan for the gateways' workload")
    live.add_argument(
        "--url",
        action="append",
        default=None,
        help="a gateway's base URL, once per gateway (default: the `crescent up` "
        "stack of --data-dir)",
    )
    live.add_argument("--data-dir", type=Path, default=None, help="a `crescent up` data folder")
    live.add_argument("--window-s", type=_above_zero, default=60.0, help="seconds observed")
    live.add_argument(
        "--min-requests",
        type=_number(int, 0),
        default=20,
        help="fewer in the window: print the plan, scale nothing",
    )
    live.add_argument(
        "--apply",
        action="store_true",
        help="scale the StatefulSets with kubectl (keep --max-*-nodes within the slots of "
        "`crescent secrets k8s`: a pod past them refuses to start)",
    )
    live.add_argument("--kubectl", default="kubectl", help="the kubectl command")
    live.add_argument("--namespace", default=NAMESPACE)
    live.add_argument("--prefill-statefulset", default=PREFILL_SET)
    live.add_argument("--decode-statefulset", default=DECODE_SET)
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
