"""deploy/k8s validates offline against the Kubernetes schemas (kubernetes-validate), and it
matches docker-compose: every compose service has its workload, probes hit the endpoints each
service serves, every credential comes from the Secret, tierd is a DaemonSet with the NVMe
folder its nodes read, and prefill and decode scale as Deployments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from crescent import config_reference
from crescent.nats_config import compose_config
from tests.deploy.test_compose import ROOT, rendered

K8S = ROOT / "deploy" / "k8s"
VERSION = "1.37.0"
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet")
CREDENTIALS = ("PASSWORD", "TOKEN", "SECRET", "SECRET_KEY", "ACCESS_KEY", "DB_URL")


def manifests() -> list[tuple[Path, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.rglob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [(path, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in manifests() if d["kind"] == kind}


def workloads() -> dict[str, dict[str, Any]]:
    return {name: d for kind in WORKLOADS for name, d in by_kind(kind).items()}


def container(workload: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def env_of(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container(workload).get("env", [])}


@pytest.mark.parametrize(("path", "doc"), manifests(), ids=lambda v: getattr(v, "name", ""))
def test_each_manifest_validates_offline(path: Path, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, VERSION, strict=True)


def test_a_broken_manifest_is_refused() -> None:
    deployment = dict(workloads()["crescent-gateway"])
    deployment["spec"] = {**deployment["spec"], "replicas": "two"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSION, strict=True)


def test_the_kustomizations_list_every_manifest() -> None:
    listed: set[Path] = set()
    for kustomization in K8S.rglob("kustomization.yaml"):
        spec = yaml.safe_load(kustomization.read_text())
        for entry in [*spec.get("resources", []), *spec.get("components", [])]:
            target = (kustomization.parent / entry).resolve()
            assert target.exists(), f"{kustomization}: {entry}"
            listed.add(target)
    assert {p.resolve() for p, _ in manifests()} <= listed


def test_every_compose_service_has_its_counterpart() -> None:
    ours = workloads()
    for name in rendered()["services"]:
        assert f"crescent-{name}" in ours or name in ours, f"no workload for {name}"
        assert name in by_kind("Service"), f"no Service named {name}"


def test_workloads_have_probes_resources_and_a_service() -> None:
    services = by_kind("Service")
    for name, workload in workloads().items():
        c = container(workload)
        assert c.get("readinessProbe") and c.get("livenessProbe"), name
        assert {"cpu", "memory"} <= set(c["resources"]["requests"]), name
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert any(s["spec"]["selector"].items() <= labels.items() for s in services.values()), (
            f"no Service selects {name}"
        )


def test_probes_hit_the_endpoints_each_service_serves() -> None:
    config = by_kind("ConfigMap")["crescent-env"]["data"]
    assert config["CRESCENT_METRICS_PORT"] == "9100"
    gateway = container(workloads()["crescent-gateway"])
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/livez"
    for name in ("scheduler", "cachemeta", "prefill", "decode", "tierd"):
        c = container(workloads()[f"crescent-{name}"])
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["metrics"] == 9100, name
        for probe in ("readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}, name


def test_every_credential_comes_from_the_secret() -> None:
    secret = by_kind("Secret")["crescent-secrets"]["stringData"]
    known = config_reference.variables()
    for name, workload in workloads().items():
        for var, entry in env_of(workload).items():
            if var.startswith("CRESCENT_") and name.startswith("crescent-"):
                assert var in known, f"{name} sets {var}, which no service reads"
            if var.endswith(CREDENTIALS):
                ref = entry.get("valueFrom", {}).get("secretKeyRef")
                assert ref is not None, f"{name}: {var} is not read from the Secret"
                assert ref["name"] == "crescent-secrets" and ref["key"] in secret, (name, var)
    for var in by_kind("ConfigMap")["crescent-env"]["data"]:
        assert not var.endswith(CREDENTIALS), var


def test_tierd_runs_on_every_node_beside_the_nodes_it_serves() -> None:
    tierd = by_kind("DaemonSet")["crescent-tierd"]
    nvme = by_kind("ConfigMap")["crescent-env"]["data"]["CRESCENT_NVME_DIR"]
    host = {"valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    writable = [m for m in container(tierd)["volumeMounts"] if m["mountPath"] == nvme]
    assert writable and not writable[0].get("readOnly")
    for role in ("prefill", "decode"):
        node = by_kind("Deployment")[f"crescent-{role}"]
        mounts = [m for m in container(node)["volumeMounts"] if m["mountPath"] == nvme]
        assert mounts and mounts[0]["readOnly"], role
        assert {k: v for k, v in env_of(node)["CRESCENT_HOST_ID"].items() if k != "name"} == host
    assert {k: v for k, v in env_of(tierd)["CRESCENT_HOST_ID"].items() if k != "name"} == host


def test_prefill_and_decode_scale_with_one_command() -> None:
    for role in ("prefill", "decode"):
        node = by_kind("Deployment")[f"crescent-{role}"]
        assert node["spec"]["replicas"] >= 1
        # Each replica names itself (its pod name): a fixed id would collide when scaled.
        assert "valueFrom" in env_of(node)["CRESCENT_NODE_ID"]
        assert (
            f"kubectl -n crescent scale deployment/crescent-{role}"
            in (K8S / "base" / f"{role}.yaml").read_text()
        )


def test_nats_runs_the_generated_configuration() -> None:
    content = by_kind("ConfigMap")["nats-config"]["data"]["crescent.conf"]
    assert content == compose_config()
    nats_env = env_of(by_kind("StatefulSet")["nats"])
    for role in ("gateway", "scheduler", "prefill", "decode", "tierd"):
        assert f"CRESCENT_NATS_{role.upper()}_PASSWORD" in nats_env
