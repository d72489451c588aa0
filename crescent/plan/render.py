"""A plan as ``crescent plan`` prints it: lines of text for a person, or one JSON object."""

from __future__ import annotations

import math
from typing import Any

from crescent.plan.observe import Observation
from crescent.plan.shapes import Objectives, Outcome, Plan, Shape


def seconds(value: float) -> str:
    if math.isinf(value):
        return "never"
    return f"{value:.3g} s" if value >= 1 else f"{value * 1000:.3g} ms"


def quantile_name(objectives: Objectives) -> str:
    return f"p{objectives.attainment * 100:g}"


def shape_text(shape: Shape) -> str:
    return f"{shape.prefill} prefill + {shape.decode} decode"


def why(outcome: Outcome, objectives: Objectives) -> str:
    """Why ``outcome`` misses the objectives (or how it meets them)."""
    q = quantile_name(objectives)
    parts = []
    for name, value, objective, missed in (
        ("TTFT", outcome.ttft_s, objectives.ttft_s, outcome.ttft_missed),
        ("TPOT", outcome.tpot_s, objectives.tpot_s, outcome.tpot_missed),
    ):
        if value > objective:
            parts.append(
                f"{name} at {q} {seconds(value)} > {seconds(objective)} "
                f"({missed:.1%} of requests miss it)"
            )
    if not parts and outcome.attainment < objectives.attainment:
        parts.append(
            f"each objective is met at {q}, but only {outcome.attainment:.1%} of requests meet both"
        )
    if outcome.rejected:
        parts.append(f"{outcome.rejected} requests refused")
    return "; ".join(parts) if parts else "meets both objectives"


def lines(plan: Plan) -> list[str]:
    """The plan as text: the answer with its margin, and its next smaller shapes."""
    objectives, best, q = plan.objectives, plan.best, quantile_name(plan.objectives)
    out = [
        f"Objectives: TTFT <= {seconds(objectives.ttft_s)} and TPOT <= "
        f"{seconds(objectives.tpot_s)} for {objectives.attainment:.1%} of requests"
    ]
    if best is None:
        limits = plan.limits
        out.append(
            f"No configuration up to {limits.max_prefill} prefill + {limits.max_decode} decode "
            "nodes meets the objectives."
        )
        closest = max(plan.tried, key=lambda o: o.attainment, default=None)
        if closest is not None:
            out.append(
                f"  closest: {shape_text(closest.shape)}: attainment "
                f"{closest.attainment:.1%}: {why(closest, objectives)}"
            )
    else:
        margin = (best.attainment - objectives.attainment) * 100
        out += [
            f"Recommended: {shape_text(best.shape)} nodes ({best.shape.nodes} in all)",
            f"  attainment {best.attainment:.1%} (required {objectives.attainment:.1%}: "
            f"margin {margin:+.1f} points)",
            f"  TTFT at {q} {seconds(best.ttft_s)} (objective {seconds(objectives.ttft_s)}), "
            f"TPOT at {q} {seconds(best.tpot_s)} (objective {seconds(objectives.tpot_s)})",
            "Next smaller configurations:",
        ]
        for shape, found in plan.smaller:
            told = "not simulated (the search was cut)"
            if found is not None:
                told = f"attainment {found.attainment:.1%}: {why(found, objectives)}"
            out.append(f"  {shape_text(shape)}: {told}")
        if not plan.smaller:
            out.append("  none: one node of each kind is the smallest cluster")
    out.append(f"{len(plan.tried)} simulations (at most {plan.limits.simulations})")
    if plan.cut:
        out.append("The search was cut at its simulation limit: a cheaper shape may exist.")
    return out


def _finite(value: float) -> float | None:
    return None if math.isinf(value) or math.isnan(value) else value


def outcome_json(outcome: Outcome, objectives: Objectives) -> dict[str, Any]:
    """One simulated shape; latencies in ms at the attainment quantile (null: never)."""
    ttft, tpot = _finite(outcome.ttft_s), _finite(outcome.tpot_s)
    return {
        "prefill_nodes": outcome.shape.prefill,
        "decode_nodes": outcome.shape.decode,
        "nodes": outcome.shape.nodes,
        "meets": outcome.attainment >= objectives.attainment,
        "attainment": outcome.attainment,
        "ttft_ms": None if ttft is None else ttft * 1000,
        "tpot_ms": None if tpot is None else tpot * 1000,
        "ttft_missed": outcome.ttft_missed,
        "tpot_missed": outcome.tpot_missed,
        "requests": outcome.requests,
        "rejected": outcome.rejected,
        "why": why(outcome, objectives),
    }


def plan_json(plan: Plan) -> dict[str, Any]:
    objectives, best = plan.objectives, plan.best
    recommended = None
    if best is not None:
        recommended = outcome_json(best, objectives)
        recommended["margin"] = {
            "attainment": best.attainment - objectives.attainment,
            "ttft_ms": _finite((objectives.ttft_s - best.ttft_s) * 1000),
            "tpot_ms": _finite((objectives.tpot_s - best.tpot_s) * 1000),
        }
    return {
        "objectives": {
            "ttft_slo_ms": objectives.ttft_s * 1000,
            "tpot_slo_ms": objectives.tpot_s * 1000,
            "attainment": objectives.attainment,
            "quantile": quantile_name(objectives),
        },
        "recommended": recommended,
        "smaller": [
            {"prefill_nodes": s.prefill, "decode_nodes": s.decode, "simulated": False}
            if found is None
            else {**outcome_json(found, objectives), "simulated": True}
            for s, found in plan.smaller
        ],
        "simulations": len(plan.tried),
        "max_simulations": plan.limits.simulations,
        "cut": plan.cut,
        "tried": [outcome_json(o, objectives) for o in plan.tried],
    }


def observation_lines(observation: Observation) -> list[str]:
    counted, means = observation.counted, observation.mean_lengths()
    out = [
        f"Observed over {observation.window_s:.0f} s: {counted.arrivals:.0f} requests "
        f"({observation.rate_per_s:.3g}/s), {observation.cached_share:.1%} of prompt tokens "
        "cached"
    ]
    if means is not None:
        out.append(f"  mean prompt {means[0]:.0f} tokens, mean output {means[1]:.0f} tokens")
    out.append(f"  length mix from the last {len(observation.recent)} requests served")
    out.append(
        f"Running: {observation.prefill_nodes} prefill + {observation.decode_nodes} decode nodes"
    )
    return out


def observation_json(observation: Observation) -> dict[str, Any]:
    counted, means = observation.counted, observation.mean_lengths()
    return {
        "window_s": observation.window_s,
        "arrivals": counted.arrivals,
        "served": counted.served,
        "rate_per_s": observation.rate_per_s,
        "mean_prompt_tokens": None if means is None else means[0],
        "mean_output_tokens": None if means is None else means[1],
        "cached_share": observation.cached_share,
        "recent": [[k.prompt_tokens, k.output_tokens] for k in observation.recent],
        "running": {"prefill": observation.prefill_nodes, "decode": observation.decode_nodes},
    }
