"""deploy/k8s is locked down: no Secret with values ships, every secret a pod reads is one
`crescent secrets k8s` creates, every pod runs as a non-root user without privileges it could
gain, and NetworkPolicies let each role reach exactly what it needs (evaluated here as the
cluster would: a connection needs an egress rule at its source and an ingress rule at its
destination, once any policy selects either pod)."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import yaml

from crescent.secrets_init import NATS_SECRET, role_secret_name
from tests.deploy.kustomize import render
from tests.deploy.test_k8s import (
    K8S,
    by_kind,
    generated_keys,
    generated_secrets,
    manifests,
    workloads,
)

OUTSIDE = "outside"  # a client outside the namespace (a user, an ingress controller)
ROLES = ("gateway", "scheduler", "cachemeta", "prefill", "decode", "tierd", "kvindex")


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def all_containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(workload)
    return [*spec.get("initContainers", []), *spec["containers"]]


def test_no_secret_ships_in_the_manifests() -> None:
    assert not by_kind("Secret")
    for _, doc in manifests():
        assert "stringData" not in doc and ("data" not in doc or doc["kind"] == "ConfigMap")


def test_every_secret_a_pod_reads_is_generated() -> None:
    keys = generated_keys()
    generated = {name: set(data) for name, data in generated_secrets().items()}
    for name, workload in workloads().items():
        for c in all_containers(workload):
            for entry in c.get("env", []):
                ref = entry.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] == "crescent-secrets" and ref["key"] in keys, (name, ref)
            assert not any("secretRef" in source for source in c.get("envFrom", [])), name
        for volume in pod_spec(workload).get("volumes", []):
            if "secret" in volume:
                secret = volume["secret"]
                assert secret["secretName"] in generated, name
                wanted = {item["key"] for item in secret.get("items", [])}
                assert wanted <= generated[secret["secretName"]], name


def test_only_nats_mounts_its_configuration_and_a_pod_only_its_roles_passwords() -> None:
    for name, workload in workloads().items():
        mounted = {
            v["secret"]["secretName"]
            for v in pod_spec(workload).get("volumes", [])
            if "secret" in v
        }
        nats_secrets = {m for m in mounted if m.startswith(NATS_SECRET)}
        if name == "nats":
            assert nats_secrets == {NATS_SECRET}
        elif name in ("crescent-cachemeta", "postgres", "s3"):
            assert not nats_secrets, name
        else:
            assert nats_secrets == {role_secret_name(name.removeprefix("crescent-"))}, name


@pytest.mark.parametrize("name", sorted(workloads()))
def test_every_pod_runs_unprivileged(name: str) -> None:
    workload = workloads()[name]
    pod = pod_spec(workload)["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] > 0
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in all_containers(workload):
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc["readOnlyRootFilesystem"] is True, c["name"]
        assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
        if sc.get("runAsUser") == 0 or sc.get("runAsNonRoot") is False:
            # Only a one-shot init container, with the one capability it needs.
            assert c in pod_spec(workload).get("initContainers", []), c["name"]
            assert sc["capabilities"]["add"] == ["CHOWN"] and c["command"][0] == "chown"
        else:
            assert "add" not in sc["capabilities"], c["name"]
    if name.startswith("crescent-"):
        assert pod["runAsUser"] == 10001
        mounts = {
            m["mountPath"] for c in all_containers(workload) for m in c.get("volumeMounts", [])
        }
        assert "/tmp" in mounts or all(
            c["name"] == "own-nvme" for c in pod_spec(workload).get("initContainers", [])
        )


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if not all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In"
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def _peer_matches(peer: dict[str, Any], labels: dict[str, str] | None) -> bool:
    if "ipBlock" in peer or "namespaceSelector" in peer:
        return labels is None  # only ever used for what is outside the namespace
    return labels is not None and _selects(peer["podSelector"], labels)


def _port_matches(rule_ports: list[dict[str, Any]] | None, port: int) -> bool:
    if not rule_ports:
        return True
    for p in rule_ports:
        if isinstance(p["port"], int) and p["port"] <= port <= p.get("endPort", p["port"]):
            return True
    return False


@functools.cache
def network_policies() -> tuple[dict[str, Any], ...]:
    return tuple(by_kind("NetworkPolicy").values())


def _allowed(
    direction: str,
    pod: dict[str, str],
    peer: dict[str, str] | None,
    port: int,
    among: tuple[dict[str, Any], ...] | None = None,
) -> bool:
    """Whether ``pod`` may connect to (egress) or be reached by (ingress) ``peer`` on ``port``
    by the policies ``among`` (default: every policy under deploy/k8s)."""
    policies = [
        p
        for p in (network_policies() if among is None else among)
        if direction.capitalize() in p["spec"]["policyTypes"]
        and _selects(p["spec"]["podSelector"], pod)
    ]
    assert policies, f"no {direction} policy selects {pod}: the default deny is missing"
    peers_key = "from" if direction == "ingress" else "to"
    for policy in policies:
        for rule in policy["spec"].get(direction, []):
            peers = rule.get(peers_key)
            if (peers is None or any(_peer_matches(x, peer) for x in peers)) and _port_matches(
                rule.get("ports"), port
            ):
                return True
    return False


def labels_of(name: str) -> dict[str, str] | None:
    if name == OUTSIDE:
        return None
    full = name if name in ("nats", "postgres", "s3") else f"crescent-{name}"
    return {"app.kubernetes.io/name": full}


def reaches(
    source: str, target: str, port: int, among: tuple[dict[str, Any], ...] | None = None
) -> bool:
    src, dst = labels_of(source), labels_of(target)
    egress = src is None or _allowed("egress", src, dst, port, among)
    assert dst is not None
    return egress and _allowed("ingress", dst, src, port, among)


ALLOWED = [
    (OUTSIDE, "gateway", 8000),
    *((role, "nats", 4222) for role in ("gateway", "scheduler", "prefill", "decode", "tierd")),
    ("kvindex", "nats", 4222),
    *((role, "cachemeta", 50051) for role in ("scheduler", "prefill", "decode", "tierd")),
    ("cachemeta", "postgres", 5432),
    ("tierd", "s3", 8333),
    ("prefill", "decode", 40123),
    ("decode", "prefill", 40123),
    ("prefill", "tierd", 40123),
    ("decode", "tierd", 40123),
    ("tierd", "prefill", 40123),
]
DENIED = [
    ("gateway", "cachemeta", 50051),
    ("gateway", "postgres", 5432),
    ("gateway", "s3", 8333),
    ("gateway", "prefill", 40123),
    ("scheduler", "postgres", 5432),
    ("scheduler", "prefill", 40123),
    ("prefill", "postgres", 5432),
    ("prefill", "s3", 8333),
    ("decode", "s3", 8333),
    ("cachemeta", "nats", 4222),
    ("cachemeta", "s3", 8333),
    (OUTSIDE, "cachemeta", 50051),
    (OUTSIDE, "nats", 4222),
    (OUTSIDE, "postgres", 5432),
    (OUTSIDE, "s3", 8333),
    (OUTSIDE, "gateway", 9000),
    # kvindex reaches NATS alone; its queries come from the namespace, not from outside.
    ("kvindex", "cachemeta", 50051),
    ("kvindex", "postgres", 5432),
    ("kvindex", "s3", 8333),
    ("kvindex", "prefill", 40123),
    ("kvindex", "gateway", 8000),
    ("prefill", "kvindex", 40123),
    (OUTSIDE, "kvindex", 8091),
    (OUTSIDE, "kvindex", 9000),
]


@pytest.mark.parametrize(("source", "target", "port"), ALLOWED)
def test_each_role_reaches_what_it_needs(source: str, target: str, port: int) -> None:
    assert reaches(source, target, port)


@pytest.mark.parametrize(("source", "target", "port"), DENIED)
def test_nothing_else_is_reachable(source: str, target: str, port: int) -> None:
    assert not reaches(source, target, port)


def test_everything_is_denied_unless_a_policy_allows_it() -> None:
    deny = by_kind("NetworkPolicy")["default-deny"]["spec"]
    assert deny["podSelector"] == {} and set(deny["policyTypes"]) == {"Ingress", "Egress"}
    assert "ingress" not in deny and "egress" not in deny


def test_kvindex_takes_queries_from_the_namespaces_pods_only() -> None:
    kvindex, caller = labels_of("kvindex"), labels_of("gateway")
    assert kvindex is not None
    assert _allowed("ingress", kvindex, caller, 8091)
    assert not _allowed("ingress", kvindex, labels_of(OUTSIDE), 8091)
    assert not _allowed("ingress", kvindex, caller, 4222)


#: The roles that speak NATS (cachemeta does not), and the kustomizations that deploy them.
NATS_CLIENTS = ("gateway", "scheduler", "prefill", "decode", "tierd", "kvindex")
RENDERINGS = (".", "overlays/dev", "overlays/production", "external")


def _policies_of(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    return tuple(o for o in objects if o["kind"] == "NetworkPolicy")


@pytest.mark.parametrize("rendering", RENDERINGS)
@pytest.mark.parametrize("role", NATS_CLIENTS)
def test_every_nats_client_reaches_nats_in_every_rendering(role: str, rendering: str) -> None:
    """In the cluster (the dependencies component) or outside it (external: egress to its
    address), by the policies of that rendering alone."""
    objects = render(K8S / rendering)
    policies = _policies_of(objects)
    in_cluster = any(
        o["kind"] == "StatefulSet"
        and o["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/name") == "nats"
        for o in objects
    )
    source = labels_of(role)
    assert source is not None
    if in_cluster:
        assert reaches(role, "nats", 4222, policies)
    else:
        assert _allowed("egress", source, labels_of(OUTSIDE), 4222, policies)
        assert not _allowed("egress", source, labels_of(OUTSIDE), 5432, policies)


def test_the_in_cluster_nats_admits_its_clients_by_its_own_policies() -> None:
    """The dependencies component lets every NATS client in without help from base, which a
    deployment may replace; cachemeta stays out."""
    text = (K8S / "dependencies" / "network-policies.yaml").read_text()
    own = _policies_of([d for d in yaml.safe_load_all(text) if d])
    for role in NATS_CLIENTS:
        assert reaches(role, "nats", 4222, own), role
    assert not reaches("cachemeta", "nats", 4222, own)


def test_no_external_server_is_reachable_from_cachemeta_but_postgres() -> None:
    policies = _policies_of(render(K8S / "external"))
    cachemeta = labels_of("cachemeta")
    assert cachemeta is not None
    assert _allowed("egress", cachemeta, labels_of(OUTSIDE), 5432, policies)
    assert not _allowed("egress", cachemeta, labels_of(OUTSIDE), 4222, policies)
