"""deploy/k8s's autoscaling and overlays, checked offline: the KEDA ScaledObjects validate
against KEDA's CRD schema and the HPAs, the adapter's ConfigMap and every object the overlays
render against the Kubernetes schemas; every trigger reads the scheduler's role gauge for its
own role; KEDA and the HPA scale alike, within the roles' NATS slots, one autoscaler per
workload, and own the replica count they scale; the dev overlay runs one small replica of
each role unscaled, the production overlay autoscales larger nodes."""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from crescent.slots import SlotSettings
from tests.deploy.keda_schema import check_scaled_object
from tests.deploy.kustomize import PatchFailed, apply_patch, render
from tests.deploy.test_k8s import K8S, ROOT, VERSION, container, is_custom

Obj = dict[str, Any]
ROLE_GAUGE = "crescent_role_saturation"
NODE_GAUGE = "crescent_saturation"
THRESHOLD = 0.8
SCALED = ("prefill", "decode")
AUTOSCALING = K8S / "autoscaling"
RENDERED = ("overlays/dev", "overlays/production", ".")
SUFFIXES = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 1e3, "M": 1e6, "G": 1e9}


@functools.cache
def _rendered(name: str) -> tuple[Obj, ...]:
    return tuple(render(K8S / name))


def rendered(name: str) -> list[Obj]:
    """The objects ``kubectl kustomize deploy/k8s/<name>`` prints (a copy to change at will)."""
    return copy.deepcopy(list(_rendered(name)))


def files(folder: str) -> list[Obj]:
    """The objects of the yaml files under deploy/k8s/<folder>, kustomizations aside."""
    paths = sorted(p for p in (K8S / folder).rglob("*.yaml") if p.name != "kustomization.yaml")
    return [d for p in paths for d in documents(p)]


def documents(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def of_kind(objects: list[Obj], kind: str) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def quantity(value: str | int) -> float:
    """A Kubernetes quantity ("500m", "2", "4Gi") as a number."""
    text = str(value)
    for suffix, factor in SUFFIXES.items():
        if text.endswith(suffix):
            return float(text.removesuffix(suffix)) * factor
    return float(text)


def autoscaler_targets(objects: list[Obj]) -> dict[str, str]:
    """Each autoscaled workload and the one ScaledObject or HPA that scales it; a second one
    for the same workload is an error (the two would undo each other's work)."""
    owners: dict[str, str] = {}
    for obj in objects:
        if obj["kind"] in ("ScaledObject", "HorizontalPodAutoscaler"):
            target = obj["spec"]["scaleTargetRef"]["name"]
            owner = f"{obj['kind']}/{obj['metadata']['name']}"
            if target in owners:
                raise ValueError(f"{target} is scaled by {owners[target]} and {owner}")
            owners[target] = owner
    return owners


def scaled_objects() -> list[Obj]:
    sources = [files("autoscaling/keda"), rendered("overlays/production")]
    return [o for objects in sources for o in objects if o["kind"] == "ScaledObject"]


def builtin_objects() -> list[Obj]:
    new = [*files("autoscaling"), *documents(K8S / "base" / "disruption-budgets.yaml")]
    return [*new, *rendered("overlays/dev"), *rendered("overlays/production")]


@pytest.mark.parametrize(
    "doc",
    [o for o in builtin_objects() if not is_custom(o)],
    ids=lambda o: f"{o['kind']}/{o['metadata']['name']}",
)
def test_each_new_and_rendered_object_validates_offline(doc: Obj) -> None:
    kubernetes_validate.validate(doc, VERSION, strict=True)


@pytest.mark.parametrize("doc", scaled_objects(), ids=lambda o: o["metadata"]["name"])
def test_each_scaled_object_validates_against_kedas_crd(doc: Obj) -> None:
    check_scaled_object(doc)


def _misspell(doc: Obj) -> None:
    doc["spec"]["maxReplicaCont"] = doc["spec"].pop("maxReplicaCount")


def _untyped(doc: Obj) -> None:
    del doc["spec"]["triggers"][0]["type"]


def _numeric_threshold(doc: Obj) -> None:
    doc["spec"]["triggers"][0]["metadata"]["threshold"] = THRESHOLD


def _misspelled_metadata(doc: Obj) -> None:
    metadata = doc["spec"]["triggers"][0]["metadata"]
    metadata["treshold"] = metadata.pop("threshold")


def _min_above_max(doc: Obj) -> None:
    doc["spec"]["minReplicaCount"] = doc["spec"]["maxReplicaCount"] + 1


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (_misspell, jsonschema.ValidationError),
        (_untyped, jsonschema.ValidationError),
        (_numeric_threshold, jsonschema.ValidationError),
        (_misspelled_metadata, ValueError),
        (_min_above_max, ValueError),
    ],
    ids=lambda v: getattr(v, "__name__", "").strip("_"),
)
def test_a_broken_scaled_object_is_refused(change: Callable[[Obj], None], error: type) -> None:
    doc = copy.deepcopy(of_kind(files("autoscaling/keda"), "ScaledObject")["crescent-prefill"])
    check_scaled_object(copy.deepcopy(doc))
    change(doc)
    with pytest.raises(error):
        check_scaled_object(doc)


def test_a_broken_hpa_is_refused() -> None:
    hpa = of_kind(files("autoscaling/hpa"), "HorizontalPodAutoscaler")["crescent-prefill"]
    broken = copy.deepcopy(hpa)
    broken["spec"]["metrics"][0]["external"]["targett"] = broken["spec"]["metrics"][0][
        "external"
    ].pop("target")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSION, strict=True)


def role_of(autoscaler: Obj) -> str:
    return str(autoscaler["spec"]["scaleTargetRef"]["name"]).removeprefix("crescent-")


@pytest.mark.parametrize("doc", scaled_objects(), ids=lambda o: o["metadata"]["name"])
def test_each_trigger_reads_the_role_gauge_of_its_own_role(doc: Obj) -> None:
    (trigger,) = doc["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "Value"
    match = re.fullmatch(r"max\((\w+)\{(.*)\}\)", trigger["metadata"]["query"])
    assert match is not None, trigger["metadata"]["query"]
    labels = dict(re.findall(r'(\w+)="([^"]*)"', match[2]))
    assert match[1] == ROLE_GAUGE
    assert labels == {"role": role_of(doc), "namespace": doc["metadata"]["namespace"]}
    assert float(trigger["metadata"]["threshold"]) == THRESHOLD


def test_each_hpa_and_the_adapter_rule_read_the_role_gauge() -> None:
    for hpa in of_kind(files("autoscaling/hpa"), "HorizontalPodAutoscaler").values():
        (metric,) = hpa["spec"]["metrics"]
        assert metric["external"]["metric"]["name"] == ROLE_GAUGE
        assert metric["external"]["metric"]["selector"] == {"matchLabels": {"role": role_of(hpa)}}
        assert quantity(metric["external"]["target"]["value"]) == THRESHOLD
    adapter = of_kind(files("autoscaling/hpa"), "ConfigMap")["crescent-prometheus-adapter"]
    (rule,) = yaml.safe_load(adapter["data"]["config.yaml"])["externalRules"]
    assert rule["seriesQuery"].startswith(ROLE_GAUGE + "{")
    assert rule["name"]["as"] == ROLE_GAUGE
    assert rule["metricsQuery"].endswith("by (role)")
    assert rule["resources"]["overrides"]["namespace"] == {"resource": "namespace"}


def test_the_scheduler_exports_the_gauges_the_triggers_read() -> None:
    sources = "".join(p.read_text() for p in (ROOT / "services" / "scheduler").glob("*.py"))
    exported = set(re.findall(r'"(crescent_\w*saturation)"', sources))
    if not exported:
        pytest.skip("the scheduler exports no saturation gauge yet")
    assert {ROLE_GAUGE, NODE_GAUGE} <= exported


def test_keda_and_the_hpa_scale_alike_within_the_slots() -> None:
    keda = of_kind(files("autoscaling/keda"), "ScaledObject")
    hpas = of_kind(files("autoscaling/hpa"), "HorizontalPodAutoscaler")
    assert set(keda) == set(hpas) == {f"crescent-{role}" for role in SCALED}
    for name, scaled in keda.items():
        spec, hpa = scaled["spec"], hpas[name]["spec"]
        assert spec["scaleTargetRef"] == hpa["scaleTargetRef"]
        assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (
            hpa["minReplicas"],
            hpa["maxReplicas"],
        )
        assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == hpa["behavior"]


@pytest.mark.parametrize("doc", scaled_objects(), ids=lambda o: o["metadata"]["name"])
def test_the_bounds_fit_the_slots_and_the_way_down_is_slow(doc: Obj) -> None:
    spec = doc["spec"]
    assert spec["maxReplicaCount"] <= SlotSettings().count(role_of(doc))
    assert 1 <= spec["minReplicaCount"] <= spec["fallback"]["replicas"] <= spec["maxReplicaCount"]
    assert spec["fallback"]["behavior"] == "currentReplicasIfHigher"
    down = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    assert down["stabilizationWindowSeconds"] >= 300
    assert all(p["type"] == "Pods" and p["value"] == 1 for p in down["policies"])


@pytest.mark.parametrize("name", RENDERED)
def test_each_workload_has_one_autoscaler_at_most(name: str) -> None:
    objects = rendered(name)
    workloads = {o["metadata"]["name"] for o in objects if o["kind"] == "StatefulSet"}
    for target in autoscaler_targets(objects):
        assert target in workloads, target
        scaled = of_kind(objects, "StatefulSet")[target]
        assert "replicas" not in scaled["spec"], f"{target}: apply would reset the autoscaler"


def test_keda_and_the_hpa_together_are_refused() -> None:
    both = [*files("autoscaling/keda"), *files("autoscaling/hpa")]
    with pytest.raises(ValueError, match="scaled by"):
        autoscaler_targets(both)
    # Kustomize refuses the two components together too: the second finds no replica count
    # left to remove.
    component = K8S / "autoscaling" / "hpa" / "kustomization.yaml"
    spec = yaml.safe_load(component.read_text())
    (remove,) = spec["patches"]
    objects = rendered("overlays/production")
    with pytest.raises(PatchFailed):
        apply_patch(objects, remove)


def requests(objects: list[Obj], name: str) -> dict[str, float]:
    (workload,) = [o for o in objects if o["metadata"]["name"] == name and "template" in o["spec"]]
    return {k: quantity(v) for k, v in container(workload)["resources"]["requests"].items()}


def test_dev_runs_one_small_replica_of_each_role_unscaled() -> None:
    dev, base = rendered("overlays/dev"), rendered("base")
    assert not [o for o in dev if o["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")]
    for role in ("gateway", "scheduler", "prefill", "decode"):
        assert of_kind(dev, "StatefulSet")[f"crescent-{role}"]["spec"]["replicas"] == 1
    for role in ("gateway", "scheduler", "cachemeta", "prefill", "decode", "tierd"):
        small, usual = requests(dev, f"crescent-{role}"), requests(base, f"crescent-{role}")
        assert all(small[k] < usual[k] for k in usual), role


def test_production_autoscales_larger_nodes_from_two() -> None:
    production, base = rendered("overlays/production"), rendered("base")
    assert set(autoscaler_targets(production)) == {f"crescent-{role}" for role in SCALED}
    for so in of_kind(production, "ScaledObject").values():
        assert so["spec"]["minReplicaCount"] == 2
    for role in ("gateway", "scheduler"):
        assert of_kind(production, "StatefulSet")[f"crescent-{role}"]["spec"]["replicas"] == 2
    for role in ("gateway", "prefill", "decode"):
        large, usual = requests(production, f"crescent-{role}"), requests(base, f"crescent-{role}")
        assert all(large[k] >= usual[k] for k in usual) and large != usual, role
