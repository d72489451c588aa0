"""Scaling a Kubernetes deployment of Crescent to a plan: whether to, and the ``kubectl``
commands that do it (``deploy/k8s/base``: the prefill and decode nodes are the StatefulSets
``crescent-prefill`` and ``crescent-decode`` in the namespace ``crescent``).

A pool that grows is scaled before one that shrinks, so the cluster never has less of both
than before or after while the pods move. A scale-down drains (SIGTERM hands over what a
node holds), so no request is lost either way.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from crescent.plan.observe import Observation
    from crescent.plan.shapes import Plan, Shape

NAMESPACE = "crescent"
PREFILL_SET = "crescent-prefill"
DECODE_SET = "crescent-decode"


@dataclass(frozen=True, slots=True)
class Target:
    """Where the pools live: the namespace and the two StatefulSets' names."""

    namespace: str = NAMESPACE
    prefill: str = PREFILL_SET
    decode: str = DECODE_SET


@dataclass(frozen=True, slots=True)
class Scale:
    """One StatefulSet to scale from ``running`` nodes (those heard from) to ``replicas``."""

    statefulset: str
    running: int
    replicas: int


def hold_reason(plan: Plan, observation: Observation, min_requests: int) -> str | None:
    """Why the plan must not be applied (None: it may be): no shape met the objectives, or
    the window saw too few requests to stand for the workload."""
    if plan.best is None:
        return "no configuration within the limits meets the objectives"
    if observation.counted.arrivals < min_requests:
        return (
            f"only {observation.counted.arrivals:.0f} requests arrived in the window "
            f"(at least {min_requests} needed to stand for the workload)"
        )
    return None


def decide(running: Shape, wanted: Shape, target: Target) -> list[Scale]:
    """The StatefulSets to scale, growing ones first; none where the count is right."""
    changes = [
        Scale(target.prefill, running.prefill, wanted.prefill),
        Scale(target.decode, running.decode, wanted.decode),
    ]
    changes = [c for c in changes if c.replicas != c.running]
    return sorted(changes, key=lambda c: c.replicas < c.running)


def command(kubectl: Sequence[str], target: Target, scale: Scale) -> list[str]:
    """The ``kubectl scale`` command line of one change."""
    return [
        *kubectl, "-n", target.namespace, "scale", f"statefulset/{scale.statefulset}",
        f"--replicas={scale.replicas}",
    ]  # fmt: skip


def apply(commands: Sequence[Sequence[str]]) -> list[tuple[list[str], int, str]]:
    """Runs each command in order, stopping at the first that fails; each as (command, exit
    status, its output)."""
    done = []
    for line in commands:
        finished = _run(list(line))
        done.append((list(line), finished.returncode, (finished.stdout + finished.stderr).strip()))
        if finished.returncode != 0:
            break
    return done


def _run(line: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(line, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(line, 127, "", str(exc))
