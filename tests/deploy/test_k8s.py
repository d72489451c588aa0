"""deploy/k8s validates offline against the Kubernetes schemas (kubernetes-validate), and it
matches docker-compose: every compose service has its workload, probes hit the endpoints each
service serves, every credential comes from the Secret `crescent secrets k8s` generates (none
ships), tierd is a DaemonSet with the NVMe folder its nodes read, and every other role that
speaks NATS is a StatefulSet whose pods are its slots: a pod's name is its node id and NATS
user, and picks its password from its role's Secret, the only NATS Secret it mounts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from crescent import config_reference
from crescent.secrets_init import (
    NATS_CONFIG_KEY,
    NATS_SECRET,
    k8s_plan,
    k8s_secret,
    k8s_secrets,
    role_secret_name,
    tls_secret_name,
)
from crescent.slots import SlotSettings
from tests.deploy.test_compose import ROOT, rendered

K8S = ROOT / "deploy" / "k8s"
VERSION = "1.37.0"
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet")
#: The roles whose replicas are slots (StatefulSets), and where their password file is mounted.
SLOTTED = ("gateway", "scheduler", "prefill", "decode")
IDENTITY_DIR = "/var/run/crescent/nats"
CREDENTIALS = ("PASSWORD", "TOKEN", "SECRET", "SECRET_KEY", "ACCESS_KEY", "DB_URL")


def is_custom(doc: dict[str, Any]) -> bool:
    """A custom resource (KEDA's ScaledObject): kubernetes-validate has no schema for it, and
    test_k8s_scaling validates it against its CRD's."""
    group = doc["apiVersion"].rpartition("/")[0]
    return "." in group and not group.endswith(".k8s.io")


def manifests() -> list[tuple[Path, dict[str, Any]]]:
    """Every Kubernetes API object of the files under deploy/k8s, custom resources aside."""
    docs = []
    for path in sorted(K8S.rglob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [(path, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return [(path, d) for path, d in docs if not is_custom(d)]


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in manifests() if d["kind"] == kind}


def workloads() -> dict[str, dict[str, Any]]:
    return {name: d for kind in WORKLOADS for name, d in by_kind(kind).items()}


def generated_keys() -> set[str]:
    """The keys of the Secret ``crescent secrets k8s`` creates."""
    secret, _ = k8s_secret(k8s_plan(SlotSettings()))
    data = secret["stringData"]
    assert isinstance(data, dict)
    return set(data)


def generated_secrets(slots: SlotSettings | None = None) -> dict[str, dict[str, str]]:
    """Every Secret ``crescent secrets k8s`` creates (default: default slots): name -> data."""
    objects, _ = k8s_secrets(k8s_plan(slots or SlotSettings()))
    secrets: dict[str, dict[str, str]] = {}
    for item in objects:
        metadata, data = item["metadata"], item["stringData"]
        assert isinstance(metadata, dict) and isinstance(data, dict)
        secrets[metadata["name"]] = data
    return secrets


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
    # secrets-init's counterpart is `crescent secrets k8s` (test_k8s_security checks it).
    for name in set(rendered()["services"]) - {"secrets-init"}:
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
    for name in ("scheduler", "cachemeta", "prefill", "decode", "tierd", "kvindex"):
        c = container(workloads()[f"crescent-{name}"])
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["metrics"] == 9100, name
        for probe in ("readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}, name


def test_every_credential_comes_from_the_secret() -> None:
    secret = generated_keys()
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
        node = by_kind("StatefulSet")[f"crescent-{role}"]
        mounts = [m for m in container(node)["volumeMounts"] if m["mountPath"] == nvme]
        assert mounts and mounts[0]["readOnly"], role
        assert {k: v for k, v in env_of(node)["CRESCENT_HOST_ID"].items() if k != "name"} == host
    assert {k: v for k, v in env_of(tierd)["CRESCENT_HOST_ID"].items() if k != "name"} == host


def test_prefill_and_decode_scale_with_one_command() -> None:
    for role in ("prefill", "decode"):
        node = by_kind("StatefulSet")[f"crescent-{role}"]
        assert node["spec"]["replicas"] >= 1
        assert (
            f"kubectl -n crescent scale statefulset/crescent-{role}"
            in (K8S / "base" / f"{role}.yaml").read_text()
        )


def pod_env(workload: dict[str, Any], pod: str) -> dict[str, str]:
    """The environment Kubernetes gives the pod ``pod``: the downward API's metadata.name,
    and each later ``$(NAME)`` replaced by a variable defined before it."""
    env: dict[str, str] = {}
    for entry in container(workload).get("env", []):
        field = entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if field == "metadata.name":
            env[entry["name"]] = pod
        elif "value" in entry:
            value = entry["value"]
            for name, known in env.items():
                value = value.replace(f"$({name})", known)
            env[entry["name"]] = value
    return env


@pytest.mark.parametrize("role", SLOTTED)
def test_each_pod_is_the_node_its_name_says_with_its_roles_passwords_only(role: str) -> None:
    workload = by_kind("StatefulSet")[f"crescent-{role}"]
    assert workload["spec"]["serviceName"] in by_kind("Service")
    pod = f"crescent-{role}-1"
    env = pod_env(workload, pod)
    id_variable = {"gateway": "CRESCENT_GATEWAY_ID", "scheduler": "CRESCENT_SCHEDULER_ID"}
    assert env[id_variable.get(role, "CRESCENT_NODE_ID")] == pod
    assert env["CRESCENT_NATS_USER"] == pod
    assert env["CRESCENT_NATS_PASSWORD_FILE"] == f"{IDENTITY_DIR}/{pod}"
    assert "CRESCENT_NATS_PASSWORD" not in env_of(workload)
    mounts = {m["name"]: m for m in container(workload)["volumeMounts"]}
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    identity = [n for n, m in mounts.items() if m["mountPath"] == IDENTITY_DIR]
    assert identity and mounts[identity[0]]["readOnly"] is True
    assert volumes[identity[0]]["secret"]["secretName"] == role_secret_name(role)
    nats_secrets = {v["secret"]["secretName"] for v in volumes.values() if "secret" in v}
    assert nats_secrets - {"crescent-secrets"} == {role_secret_name(role), tls_secret_name(role)}
    # The default replicas fit the default slots, and a pod past them is refused by name.
    assert workload["spec"]["replicas"] <= SlotSettings().count(role)
    assert container(workload)["command"][:5] == ["crescent", "secrets", "exec", "--pod-slot", role]


def test_nats_runs_the_generated_configuration_for_every_pod() -> None:
    nats_pod = by_kind("StatefulSet")["nats"]
    args = container(nats_pod)["args"]
    config_path = Path(args[args.index("-c") + 1])
    volume = next(
        v for v in nats_pod["spec"]["template"]["spec"]["volumes"] if v["name"] == "config"
    )
    mount = next(m for m in container(nats_pod)["volumeMounts"] if m["name"] == "config")
    assert mount["name"] == volume["name"] and Path(mount["mountPath"]) == config_path.parent
    assert volume["secret"]["secretName"] == NATS_SECRET
    assert volume["secret"]["items"] == [{"key": NATS_CONFIG_KEY, "path": config_path.name}]
    assert not any("PASSWORD" in name for name in env_of(nats_pod))
    assert "ConfigMap" not in {d["kind"] for p, d in manifests() if p.name == "nats.yaml"}
    config = generated_secrets()[NATS_SECRET]
    for user in ("tierd", "kvindex"):  # a role's user, for pods named after no ordinal
        assert f'user: "{user}"' in config[NATS_CONFIG_KEY]
    for role in SLOTTED:
        replicas = by_kind("StatefulSet")[f"crescent-{role}"]["spec"]["replicas"]
        for ordinal in range(replicas):
            assert f'user: "crescent-{role}-{ordinal}"' in config[NATS_CONFIG_KEY]


def test_kvindex_runs_as_its_user_and_answers_on_its_port() -> None:
    workload = by_kind("Deployment")["crescent-kvindex"]
    assert workload["spec"]["replicas"] == 1
    env = pod_env(workload, "crescent-kvindex-5d9f7-x2k4q")
    assert env["CRESCENT_NATS_USER"] == env["CRESCENT_NODE_ID"] == "kvindex"
    assert env["CRESCENT_NATS_PASSWORD_FILE"] == f"{IDENTITY_DIR}/kvindex"
    assert "kvindex" in generated_secrets()[role_secret_name("kvindex")]
    ports = {p["name"]: p["containerPort"] for p in container(workload)["ports"]}
    assert ports["query"] == int(env["CRESCENT_KVINDEX_PORT"]) == 8091
    service = by_kind("Service")["kvindex"]
    assert {p["port"] for p in service["spec"]["ports"]} == {8091, 9100}
    assert env_of(workload)["CRESCENT_CACHEMETA_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == (
        "cachemeta-token"
    )
