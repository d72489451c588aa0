"""The kustomize renderer of the deployment tests (tests/deploy/kustomize.py): it renders every
kustomization under deploy/k8s as `kubectl kustomize` does (compared where kubectl is
installed), merges and orders patched lists as kustomize does, fails where kustomize fails,
and refuses by name what it does not render."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.kustomize import PatchFailed, Unsupported, json6902, render, split_image
from tests.deploy.test_k8s import K8S

KUBECTL = shutil.which("kubectl")
KUSTOMIZATIONS = sorted(
    p.parent
    for p in K8S.rglob("kustomization.yaml")
    if yaml.safe_load(p.read_text()).get("kind") != "Component"
)

DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
        - name: one
          image: registry.example:5000/web:1.0
          env:
            - {name: A, value: "1"}
            - {name: B, value: "2"}
            - {name: C, value: "3"}
        - name: two
          image: sidecar
"""


def keyed(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in objects
    }


def kubectl_kustomize(path: Path) -> list[dict[str, Any]]:
    assert KUBECTL is not None
    out = subprocess.run(
        [KUBECTL, "kustomize", str(path)], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def folder(tmp_path: Path, kustomization: str, **files: str) -> Path:
    (tmp_path / "kustomization.yaml").write_text(kustomization)
    for name, text in files.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    return tmp_path


@pytest.mark.skipif(KUBECTL is None, reason="kubectl (with its kustomize) is not installed")
@pytest.mark.parametrize("path", KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(K8S)) or ".")
def test_each_kustomization_renders_as_kubectl_kustomize_does(path: Path) -> None:
    assert keyed(render(path)) == keyed(kubectl_kustomize(path))


def test_a_strategic_merge_puts_the_items_it_names_first(tmp_path: Path) -> None:
    patch = """\
  - patch: |-
      apiVersion: apps/v1
      kind: Deployment
      metadata: {name: web}
      spec:
        template:
          spec:
            containers:
              - name: two
                image: sidecar:2
              - name: one
                env:
                  - {name: NEW, value: "9"}
                  - {name: B, value: "20"}
"""
    path = folder(tmp_path, f"resources: [web.yaml]\npatches:\n{patch}", web=DEPLOYMENT)
    (web,) = render(path)
    two, one = web["spec"]["template"]["spec"]["containers"]
    assert (two["name"], two["image"]) == ("two", "sidecar:2")
    assert [(e["name"], e["value"]) for e in one["env"]] == [
        ("NEW", "9"),
        ("B", "20"),
        ("A", "1"),
        ("C", "3"),
    ]
    assert one["image"] == "registry.example:5000/web:1.0"
    if KUBECTL is not None:
        assert [web] == kubectl_kustomize(path)


def test_transformers_set_namespace_labels_replicas_and_images(tmp_path: Path) -> None:
    namespace = "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n"
    spec = """\
resources: [web.yaml, ns.yaml]
namespace: shop
labels:
  - pairs: {team: store}
replicas:
  - {name: web, count: 1}
images:
  - {name: registry.example:5000/web, newTag: "2.0"}
"""
    path = folder(tmp_path, spec, web=DEPLOYMENT, ns=namespace)
    objects = keyed(render(path))
    web = objects["Deployment", "shop", "web"]
    assert web["spec"]["replicas"] == 1
    assert web["metadata"]["labels"] == {"team": "store"}
    assert web["spec"]["template"]["metadata"]["labels"] == {"app": "web"}
    images = [c["image"] for c in web["spec"]["template"]["spec"]["containers"]]
    assert images == ["registry.example:5000/web:2.0", "sidecar"]
    assert "namespace" not in objects["Namespace", "", "shop"]["metadata"]
    if KUBECTL is not None:
        assert objects == keyed(kubectl_kustomize(path))


def test_json_patch_operations_and_a_path_that_names_nothing() -> None:
    obj: dict[str, Any] = {"spec": {"replicas": 2, "ports": [1, 3]}}
    json6902(obj, {"op": "add", "path": "/spec/ports/1", "value": 2})
    json6902(obj, {"op": "add", "path": "/spec/ports/-", "value": 4})
    json6902(obj, {"op": "replace", "path": "/spec/replicas", "value": 5})
    json6902(obj, {"op": "add", "path": "/spec/a~1b", "value": True})
    assert obj == {"spec": {"replicas": 5, "ports": [1, 2, 3, 4], "a/b": True}}
    json6902(obj, {"op": "remove", "path": "/spec/replicas"})
    with pytest.raises(PatchFailed, match="nothing to remove"):
        json6902(obj, {"op": "remove", "path": "/spec/replicas"})
    with pytest.raises(Unsupported, match="move"):
        json6902(obj, {"op": "move", "from": "/spec/ports", "path": "/spec/other"})


def test_a_patch_selecting_nothing_fails(tmp_path: Path) -> None:
    spec = """\
resources: [web.yaml]
patches:
  - target: {kind: StatefulSet, name: web}
    patch: '[{"op": "remove", "path": "/spec/replicas"}]'
"""
    with pytest.raises(Unsupported, match="no object matches"):
        render(folder(tmp_path, spec, web=DEPLOYMENT))


@pytest.mark.parametrize(
    "spec",
    [
        "resources: [web.yaml]\nconfigMapGenerator: [{name: x, literals: [a=b]}]\n",
        "resources: [web.yaml]\npatches: [{path: p.yaml}]\n",
        "resources: [web.yaml]\npatches:\n  - target: {labelSelector: app=web}\n    patch: '[]'\n",
        "resources: [web.yaml]\nlabels: [{pairs: {a: b}, includeSelectors: true}]\n",
        "resources: [web.yaml]\npatches:\n  - patch: |-\n      apiVersion: apps/v1\n"
        "      kind: Deployment\n      metadata: {name: web}\n      $patch: delete\n",
    ],
    ids=["generator", "patch-file", "label-selector", "selector-labels", "directive"],
)
def test_what_is_not_rendered_here_is_refused_by_name(tmp_path: Path, spec: str) -> None:
    with pytest.raises(Unsupported):
        render(folder(tmp_path, spec, web=DEPLOYMENT))


def test_a_component_is_only_rendered_inside_a_kustomization(tmp_path: Path) -> None:
    component = "apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\n"
    with pytest.raises(Unsupported, match="is a component"):
        render(folder(tmp_path, component))


def test_image_references() -> None:
    assert split_image("crescent") == ("crescent", "")
    assert split_image("nats:2.15-alpine") == ("nats", "2.15-alpine")
    assert split_image("registry.example:5000/crescent") == ("registry.example:5000/crescent", "")
    with pytest.raises(Unsupported):
        split_image("crescent@sha256:00")
