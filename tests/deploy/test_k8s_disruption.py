"""deploy/k8s under voluntary disruption, checked offline in the base and in every rendering
(default, dev, production): each role that runs several replicas has a disruption budget of
one pod, which selects that role's pods; a pod's grace period outlasts its preStop wait, its
drain and its close; the gateway waits for its endpoints before SIGTERM with the kubelet's
own sleep; prefill and decode nodes spread over hosts; overlays' patches leave every env
reference after the variable it names, and every object lands in the stack's namespace."""

from __future__ import annotations

import re
from typing import Any

import pytest

from services.gateway.config import GatewaySettings
from shared.node.settings import NodeSettings
from shared.runtime import STOP_CLOSE_S
from tests.deploy.kustomize import CLUSTER_SCOPED
from tests.deploy.test_k8s import container, env_of
from tests.deploy.test_k8s_scaling import RENDERED, SCALED, autoscaler_targets, of_kind, rendered

Obj = dict[str, Any]
SOURCES = ("base", *RENDERED)
DRAINING = ("gateway", "prefill", "decode")
PODS = ("Deployment", "StatefulSet", "DaemonSet")
#: What a drain may take where no pod sets CRESCENT_DRAIN_TIMEOUT_S: the services' own default.
DEFAULT_DRAIN_S = {
    "gateway": GatewaySettings.model_fields["drain_timeout_s"].default,
    "prefill": NodeSettings.model_fields["drain_timeout_s"].default,
    "decode": NodeSettings.model_fields["drain_timeout_s"].default,
}


def workloads(objects: list[Obj]) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] in PODS}


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    if set(selector) - {"matchLabels"}:
        raise AssertionError(f"selector not evaluated here: {selector}")
    return selector["matchLabels"].items() <= labels.items()


def budget_targets(budget: Obj, objects: list[Obj]) -> list[str]:
    """The workloads whose pods ``budget`` selects; none is an error: a budget that guards
    nothing is a typo."""
    chosen = [
        name
        for name, w in workloads(objects).items()
        if selects(budget["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])
    ]
    assert chosen, f"{budget['metadata']['name']} selects no pod"
    return chosen


def most_replicas(objects: list[Obj], workload: Obj) -> int:
    """The replicas a workload may run: its autoscaler's maximum, or its count."""
    name = workload["metadata"]["name"]
    if name in autoscaler_targets(objects):
        return max(
            o["spec"].get("maxReplicaCount", o["spec"].get("maxReplicas", 1))
            for o in objects
            if o["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")
            and o["spec"]["scaleTargetRef"]["name"] == name
        )
    return int(workload["spec"].get("replicas", 1))


@pytest.mark.parametrize("source", SOURCES)
def test_each_role_running_several_pods_loses_one_at_a_time(source: str) -> None:
    objects = rendered(source)
    budgets = of_kind(objects, "PodDisruptionBudget")
    guarded = {name: budget_targets(b, objects) for name, b in budgets.items()}
    for name, targets in guarded.items():
        assert targets == [name], f"{name} selects {targets}"
        assert budgets[name]["spec"]["maxUnavailable"] == 1
    for name, workload in workloads(objects).items():
        several = workload["kind"] != "DaemonSet" and most_replicas(objects, workload) > 1
        if several and name.startswith("crescent-"):
            assert name in guarded, f"{name} runs several pods and has no budget"


def test_a_budget_selecting_no_pod_fails() -> None:
    objects = rendered("base")
    budget = of_kind(objects, "PodDisruptionBudget")["crescent-prefill"]
    budget["spec"]["selector"] = {"matchLabels": {"app.kubernetes.io/name": "crescent-prefil"}}
    with pytest.raises(AssertionError, match="selects no pod"):
        budget_targets(budget, objects)


def drain_s(role: str, workload: Obj) -> float:
    entry = env_of(workload).get("CRESCENT_DRAIN_TIMEOUT_S")
    return float(entry["value"]) if entry else float(DEFAULT_DRAIN_S[role])


def prestop_s(workload: Obj) -> float:
    hook = container(workload).get("lifecycle", {}).get("preStop")
    if hook is None:
        return 0.0
    # The kubelet's sleep runs nothing in the container: no command the image must have.
    assert set(hook) == {"sleep"}, hook
    return float(hook["sleep"]["seconds"])


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("role", DRAINING)
def test_the_grace_period_outlasts_the_wait_the_drain_and_the_close(source: str, role: str) -> None:
    workload = workloads(rendered(source))[f"crescent-{role}"]
    grace = workload["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    # After SIGTERM the service's watchdog ends a stop at the drain plus STOP_CLOSE_S; the
    # kubelet's SIGKILL must come later, or the watchdog's stacks never reach the log.
    assert grace > prestop_s(workload) + drain_s(role, workload) + STOP_CLOSE_S


@pytest.mark.parametrize("source", SOURCES)
def test_the_gateway_waits_for_its_endpoints_before_sigterm(source: str) -> None:
    gateway = workloads(rendered(source))["crescent-gateway"]
    assert prestop_s(gateway) >= 5


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("role", SCALED)
def test_prefill_and_decode_nodes_spread_over_hosts(source: str, role: str) -> None:
    node = workloads(rendered(source))[f"crescent-{role}"]
    pod = node["spec"]["template"]
    (spread,) = pod["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway" and spread["maxSkew"] == 1
    assert selects(spread["labelSelector"], pod["metadata"]["labels"])
    others = [w for n, w in workloads(rendered(source)).items() if n != node["metadata"]["name"]]
    assert not any(
        selects(spread["labelSelector"], w["spec"]["template"]["metadata"]["labels"])
        for w in others
    )


@pytest.mark.parametrize("source", RENDERED)
def test_every_env_reference_follows_the_variable_it_names(source: str) -> None:
    # A strategic merge patch moves the variables it names to the front of the list, where a
    # $(NAME) they hold would no longer see NAME.
    for name, workload in workloads(rendered(source)).items():
        for c in workload["spec"]["template"]["spec"]["containers"]:
            seen: set[str] = set()
            for entry in c.get("env", []):
                for ref in re.findall(r"\$\((\w+)\)", str(entry.get("value", ""))):
                    assert ref in seen, f"{name}: {entry['name']} reads $({ref}) before it is set"
                seen.add(entry["name"])


@pytest.mark.parametrize("source", RENDERED)
def test_every_object_lands_in_the_stacks_namespace(source: str) -> None:
    for obj in rendered(source):
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"].get("namespace") == "crescent", obj["metadata"]["name"]
