"""How ``crescent plan --live --apply`` scales a Kubernetes deployment: whether it may, which
StatefulSets change and in what order, and the ``kubectl`` lines it runs (not kubectl)."""

from __future__ import annotations

from pathlib import Path

import yaml

from crescent.plan.observe import Counts, Observation
from crescent.plan.scale import (
    DECODE_SET,
    NAMESPACE,
    PREFILL_SET,
    Scale,
    Target,
    command,
    decide,
    hold_reason,
)
from crescent.plan.shapes import Limits, Objectives, Outcome, Plan, Shape

BASE = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "base"
TARGET = Target()


def test_the_names_are_the_deployment_s() -> None:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    assert kustomization["namespace"] == NAMESPACE
    for name, role in ((PREFILL_SET, "prefill"), (DECODE_SET, "decode")):
        documents = yaml.safe_load_all((BASE / f"{role}.yaml").read_text())
        sets = [d["metadata"]["name"] for d in documents if d and d["kind"] == "StatefulSet"]
        assert sets == [name]


def test_growing_pools_are_scaled_before_shrinking_ones() -> None:
    assert decide(Shape(4, 2), Shape(2, 5), TARGET) == [
        Scale(DECODE_SET, 2, 5),
        Scale(PREFILL_SET, 4, 2),
    ]
    assert decide(Shape(1, 6), Shape(3, 2), TARGET) == [
        Scale(PREFILL_SET, 1, 3),
        Scale(DECODE_SET, 6, 2),
    ]


def test_a_pool_of_the_right_size_is_left_alone() -> None:
    assert decide(Shape(3, 2), Shape(3, 2), TARGET) == []
    assert decide(Shape(3, 2), Shape(3, 4), TARGET) == [Scale(DECODE_SET, 2, 4)]


def test_the_command_line() -> None:
    target = Target("serving", "my-prefill", "my-decode")
    change = decide(Shape(1, 1), Shape(5, 1), target)[0]
    assert command(["kubectl", "--context", "prod"], target, change) == [
        "kubectl", "--context", "prod", "-n", "serving", "scale", "statefulset/my-prefill",
        "--replicas=5",
    ]  # fmt: skip


def plan_of(best: Shape | None) -> Plan:
    objectives = Objectives(1.0, 0.1, 0.9)
    outcome = None if best is None else Outcome(best, 0.95, 0.5, 0.05, 0.02, 0.03, 100, 0)
    return Plan(objectives, Limits(), outcome, (), () if outcome is None else (outcome,), False)


def observed(arrivals: int) -> Observation:
    return Observation(60.0, Counts(arrivals, arrivals, 100.0 * arrivals), (), 2, 2)


def test_when_a_plan_may_be_applied() -> None:
    assert hold_reason(plan_of(Shape(3, 2)), observed(50), min_requests=20) is None
    too_few = hold_reason(plan_of(Shape(3, 2)), observed(5), min_requests=20)
    assert too_few is not None and "only 5 requests" in too_few
    none_met = hold_reason(plan_of(None), observed(500), min_requests=20)
    assert none_met is not None and "no configuration" in none_met
