"""``crescent plan``: the fewest prefill and decode nodes that meet TTFT and TPOT objectives for
a workload, found by simulating it (``crescent sim``'s cluster; ``search`` says how).

    crescent plan --ttft-slo-ms 10000 --tpot-slo-ms 100 --attainment 0.9 --cost-model a800
    crescent plan --rate 4 --mix 2048:256:3,8192:512 --shared-share 0.3 --json
    crescent plan --live --url http://gateway:8000 --apply
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from crescent.plan.options import add_arguments

if TYPE_CHECKING:
    from crescent.plan.observe import Observation
    from crescent.plan.shapes import Plan
    from crescent.sim.costs import CostModel
    from crescent.traces import TraceRecord


class _Stop(Exception):
    """The run ends early: the message for stderr and the exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def run(args: argparse.Namespace) -> int:
    from crescent.plan.evaluate import SimulatedCluster
    from crescent.plan.search import plan
    from crescent.plan.shapes import Limits, Objectives
    from crescent.sim.cluster import SimConfig
    from crescent.sim.costs import cost_model

    cost_name = args.cost_model or ("local" if args.live else "a800")
    cost = cost_model(cost_name)
    observation = None
    try:
        _check(args)
        observation = _observe(args) if args.live else None
        records, workload = _records(args, cost, observation)
    except _Stop as stop:
        if observation is not None and not args.json:
            _print_observation(observation)
        sys.stderr.write(f"crescent plan: {stop}\n")
        return stop.status
    objectives = Objectives(
        cost.slo_ttft_s if args.ttft_slo_ms is None else args.ttft_slo_ms / 1000,
        cost.slo_tpot_s if args.tpot_slo_ms is None else args.tpot_slo_ms / 1000,
        args.attainment,
    )
    base = SimConfig(
        capacity_blocks=args.capacity_blocks,
        policy=args.policy,
        scheduler=args.scheduler,
        cost_model=cost_name,
        time_scale=_time_scale(args),
        seed=args.seed,
        decode_pools=not args.no_decode_pools,
    )
    limits = Limits(args.max_prefill_nodes, args.max_decode_nodes, args.max_simulations)
    found = plan(SimulatedCluster(records, base, objectives), objectives, limits)
    workload.update(cost_model=cost_name, scheduler=args.scheduler, time_scale=base.time_scale)
    return _report(args, found, workload, observation)


def _check(args: argparse.Namespace) -> None:
    if args.apply and not args.live:
        raise _Stop("error: --apply scales a running cluster: it needs --live", 2)
    if (args.rate is None) != (args.mix is None):
        raise _Stop("error: a synthetic workload needs both --rate and --mix", 2)
    if args.live and args.rate is not None:
        raise _Stop("error: --live plans for the observed workload: leave out --rate and --mix", 2)


def _observe(args: argparse.Namespace) -> Observation:
    from crescent.plan.live import gateway_urls, watch

    urls = gateway_urls(args.url, args.data_dir)
    if not urls:
        raise _Stop("no gateway to observe: pass --url, or start a stack with `crescent up`", 1)
    if not args.json:
        print(f"Observing {', '.join(urls)} for {args.window_s:g} s ...", flush=True)
    try:
        return watch(urls, args.window_s)
    except OSError as exc:
        raise _Stop(f"error: cannot read the gateway: {exc}", 1) from None


def _records(
    args: argparse.Namespace, cost: CostModel, observation: Observation | None
) -> tuple[list[TraceRecord], dict[str, Any]]:
    """The requests to replay, and what they are for the report."""
    from crescent.plan.workload import Workload
    from crescent.traces import TraceError, load_trace

    if observation is not None:
        workload = observation.workload(args.requests, args.seed)
        if workload is None:
            raise _Stop("no requests observed in the window: nothing to plan for", 1)
    elif args.rate is not None:
        workload = Workload(args.rate, args.mix, args.shared_share, args.requests, args.seed)
    else:
        try:
            records = load_trace(args.trace, args.num_requests)
        except TraceError as exc:
            raise _Stop(f"error: {exc}", 2) from None
        if not records:
            raise _Stop(f"error: {args.trace}: no requests", 2)
        return records, {"source": "trace", "trace": str(args.trace), "requests": len(records)}
    prompt, output = workload.mean_lengths()
    described = {
        "source": "live" if observation is not None else "synthetic",
        "requests": workload.requests,
        "rate_per_s": workload.rate_per_s,
        "mean_prompt_tokens": prompt,
        "mean_output_tokens": output,
        "kinds": len(workload.mix),
        "shared_share": workload.shared_share,
    }
    return workload.records(cost.block_tokens), described


def _time_scale(args: argparse.Namespace) -> float:
    if args.rate_multiplier is not None:
        return float(1 / args.rate_multiplier)
    return 1.0 if args.time_scale is None else float(args.time_scale)


def _report(
    args: argparse.Namespace, found: Plan, workload: dict[str, Any], observation: Observation | None
) -> int:
    from crescent.plan.render import lines, observation_json, plan_json

    out: dict[str, Any] = {"workload": workload, **plan_json(found)}
    status = 0 if found.best is not None else 1
    if observation is not None:
        out["observed"] = observation_json(observation)
        scaling, status = _scaling(args, found, observation)
        out["scaling"] = scaling
    if args.json:
        print(json.dumps(out))
        return status
    if observation is not None:
        _print_observation(observation)
    print(_workload_line(workload))
    print("\n".join(lines(found)))
    if observation is not None:
        _print_scaling(out["scaling"])
    return status


def _scaling(
    args: argparse.Namespace, found: Plan, observation: Observation
) -> tuple[dict[str, Any], int]:
    """What the live mode decided and, with --apply, did; with the run's exit status."""
    from crescent.plan.scale import Target, apply, command, decide, hold_reason
    from crescent.plan.shapes import Shape

    hold = hold_reason(found, observation, args.min_requests)
    decision: dict[str, Any] = {"hold": hold, "commands": [], "applied": []}
    if hold is not None or found.best is None:
        return decision, 1 if args.apply or found.best is None else 0
    target = Target(args.namespace, args.prefill_statefulset, args.decode_statefulset)
    running = Shape(observation.prefill_nodes, observation.decode_nodes)
    kubectl = shlex.split(args.kubectl)
    commands = [command(kubectl, target, c) for c in decide(running, found.best.shape, target)]
    decision["commands"] = commands
    if not args.apply:
        return decision, 0
    done = apply(commands)
    decision["applied"] = [{"command": c, "status": rc, "output": text} for c, rc, text in done]
    failed = any(rc != 0 for _, rc, _ in done)
    return decision, 1 if failed else 0


def _workload_line(workload: dict[str, Any]) -> str:
    pace = f"time scale {workload['time_scale']:g}"
    costs = f"{workload['cost_model']} costs, {workload['scheduler']} scheduler"
    if workload["source"] == "trace":
        return (
            f"Workload: {workload['requests']:,} requests of {workload['trace']}, {pace}, {costs}"
        )
    return (
        f"Workload ({workload['source']}): {workload['requests']:,} requests at "
        f"{workload['rate_per_s']:.3g}/s, mean prompt {workload['mean_prompt_tokens']:.0f} and "
        f"output {workload['mean_output_tokens']:.0f} tokens, {workload['shared_share']:.0%} "
        f"shared, {pace}, {costs}"
    )


def _print_observation(observation: Observation) -> None:
    from crescent.plan.render import observation_lines

    print("\n".join(observation_lines(observation)))


def _print_scaling(scaling: dict[str, Any]) -> None:
    if scaling["hold"] is not None:
        print(f"Not scaling: {scaling['hold']}")
    elif not scaling["commands"]:
        print("Scaling: the running counts are the recommended ones; nothing to do")
    elif not scaling["applied"]:
        print("Scaling (run again with --apply to do it):")
        print("\n".join(f"  {shlex.join(c)}" for c in scaling["commands"]))
    for done in scaling["applied"]:
        print(f"  {shlex.join(done['command'])}: exit {done['status']} {done['output']}".rstrip())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="crescent plan", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
