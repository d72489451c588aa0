"""Renders a kustomization as `kubectl kustomize` does, for the part of kustomize deploy/k8s
uses: resources (files and folders), components, inline patches (JSON 6902 operations, or a
strategic merge), namespace, labels (metadata only), replicas and images. Any other field is
refused by name, so a kustomization that outgrows this part fails its test instead of
rendering differently from kustomize (test_k8s_scaling compares both where kubectl is)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]

FIELDS = frozenset(
    {"apiVersion", "kind", "resources", "components", "patches"}
    | {"namespace", "labels", "replicas", "images"}
)
#: Kinds without a namespace, among those deploy/k8s could hold.
CLUSTER_SCOPED = frozenset(
    {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
    | {"PriorityClass", "StorageClass", "APIService", "PersistentVolume"}
)
SCALABLE = frozenset({"Deployment", "StatefulSet", "ReplicaSet", "ReplicationController"})
#: The merge key of each list a strategic merge patch merges item by item (the Kubernetes
#: API's patchMergeKey); every other list is replaced whole, as kustomize replaces lists
#: that have none.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
}


class Unsupported(ValueError):
    """A kustomization asks for something this renderer does not do."""


class PatchFailed(ValueError):
    """A patch kustomize refuses too: its path names nothing to replace or remove."""


def render(folder: Path) -> list[Obj]:
    """The objects ``kubectl kustomize folder`` would print, in no particular order."""
    spec = _read(folder)
    if spec.get("kind") == "Component":
        raise Unsupported(f"{folder} is a component: render a kustomization that uses it")
    return _build(folder, spec, [])


def _read(folder: Path) -> Obj:
    spec: Obj = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(spec) - FIELDS
    if unknown:
        raise Unsupported(f"{folder}: kustomization fields not rendered here: {sorted(unknown)}")
    return spec


def _build(folder: Path, spec: Obj, objects: list[Obj]) -> list[Obj]:
    """Adds ``spec``'s resources to ``objects`` (a component's parent's, or none), then its
    components, then applies its own transformations to all of them, in kustomize's order."""
    for entry in spec.get("resources", []):
        objects += _load(folder / entry)
    for entry in spec.get("components", []):
        component = _read(folder / entry)
        if component.get("kind") != "Component":
            raise Unsupported(f"{folder / entry} is listed as a component but is not one")
        objects = _build(folder / entry, component, objects)
    for patch in spec.get("patches", []):
        apply_patch(objects, patch)
    if "namespace" in spec:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = spec["namespace"]
    for label in spec.get("labels", []):
        _add_labels(objects, label)
    for replicas in spec.get("replicas", []):
        _set_replicas(objects, replicas["name"], replicas["count"])
    for image in spec.get("images", []):
        for obj in objects:
            _retag(obj, image)
    return objects


def _load(path: Path) -> list[Obj]:
    if path.is_dir():
        return render(path)
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def apply_patch(objects: list[Obj], entry: Obj) -> None:
    """Applies one ``patches`` entry to the objects its target selects (a strategic merge
    patch without a target selects the object of its own kind and name)."""
    if set(entry) - {"patch", "target"}:
        raise Unsupported(f"patch fields not rendered here: {sorted(set(entry))}")
    body = yaml.safe_load(entry["patch"])
    target = entry.get("target")
    if isinstance(body, dict) and target is None:
        target = {"kind": body["kind"], "name": body["metadata"]["name"]}
    if target is None:
        raise Unsupported("a JSON 6902 patch needs a target")
    chosen = [obj for obj in objects if _selected(obj, target)]
    if not chosen:
        raise Unsupported(f"no object matches the patch target {target}")
    for obj in chosen:
        if isinstance(body, list):
            for op in body:
                json6902(obj, op)
        else:
            merge(obj, {k: v for k, v in body.items() if k not in ("apiVersion", "kind")})


def _selected(obj: Obj, target: Obj) -> bool:
    if set(target) - {"kind", "name", "namespace", "group", "version"}:
        raise Unsupported(f"patch target fields not rendered here: {sorted(target)}")
    group, _, version = obj["apiVersion"].rpartition("/")
    actual = {
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "namespace": obj["metadata"].get("namespace", ""),
        "group": group,
        "version": version,
    }
    # kustomize reads each of these as an anchored regular expression.
    return all(re.fullmatch(str(want), actual[key]) for key, want in target.items())


def json6902(obj: Obj, op: Obj) -> None:
    """One RFC 6902 operation: add, replace or remove (the ones deploy/k8s uses)."""
    *parents, last = [
        part.replace("~1", "/").replace("~0", "~") for part in op["path"].split("/")[1:]
    ]
    node: Any = obj
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    kind = op["op"]
    if kind not in ("add", "replace", "remove"):
        raise Unsupported(f"JSON 6902 operation not rendered here: {kind}")
    if isinstance(node, list):
        index = len(node) if last == "-" else int(last)
        if kind == "add":
            node.insert(index, copy.deepcopy(op["value"]))
        elif kind == "replace":
            node[index] = copy.deepcopy(op["value"])
        else:
            del node[index]
    elif kind == "add":
        node[last] = copy.deepcopy(op["value"])
    else:
        if last not in node:
            raise PatchFailed(f"{op['path']}: nothing to {kind}")
        if kind == "replace":
            node[last] = copy.deepcopy(op["value"])
        else:
            del node[last]


def merge(target: Obj, patch: Obj) -> None:
    """A strategic merge: maps merge key by key (null deletes), the lists of MERGE_KEYS item
    by item on their key, every other value is replaced."""
    for key, value in patch.items():
        if key.startswith("$") or (isinstance(value, dict) and "$patch" in value):
            raise Unsupported(f"strategic merge directives are not rendered here: {key}")
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        elif isinstance(value, list) and key in MERGE_KEYS and isinstance(target.get(key), list):
            target[key] = _merge_list(target[key], value, MERGE_KEYS[key])
        else:
            target[key] = copy.deepcopy(value)


def _merge_list(items: list[Obj], patch: list[Obj], key: str) -> list[Obj]:
    """The patch's items first, in its order (each merged into the item of the same key, if
    any), then the items it does not name, in theirs: the order kustomize gives them."""
    old = {item.get(key): item for item in items}
    merged = []
    for item in patch:
        if item[key] in old:
            merge(old[item[key]], item)
            merged.append(old[item[key]])
        else:
            merged.append(copy.deepcopy(item))
    named = {item[key] for item in patch}
    return merged + [item for item in items if item.get(key) not in named]


def _add_labels(objects: list[Obj], label: Obj) -> None:
    if label.get("includeSelectors") or label.get("includeTemplates"):
        raise Unsupported("labels on selectors or templates are not rendered here")
    for obj in objects:
        obj["metadata"].setdefault("labels", {}).update(label["pairs"])


def _set_replicas(objects: list[Obj], name: str, count: int) -> None:
    chosen = [o for o in objects if o["metadata"]["name"] == name and o["kind"] in SCALABLE]
    if not chosen:
        raise Unsupported(f"replicas: no workload named {name}")
    for obj in chosen:
        obj["spec"]["replicas"] = count


def _retag(node: Any, image: Obj) -> None:
    """Renames ``image['name']`` (with any tag) wherever a container list names it."""
    if isinstance(node, list):
        for item in node:
            _retag(item, image)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers"):
                for c in value:
                    name, tag = split_image(c["image"])
                    if name == image["name"]:
                        new_tag = image.get("newTag", tag)
                        new_name = image.get("newName", name)
                        c["image"] = f"{new_name}:{new_tag}" if new_tag else new_name
            else:
                _retag(value, image)


def split_image(reference: str) -> tuple[str, str]:
    """An image reference's name and tag ("" without one); a registry's port is the name's."""
    if "@" in reference:
        raise Unsupported(f"images by digest are not rendered here: {reference}")
    name, colon, tag = reference.rpartition(":")
    if not colon or "/" in tag:
        return reference, ""
    return name, tag
