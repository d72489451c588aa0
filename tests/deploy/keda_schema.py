"""KEDA's ScaledObject checked offline as a cluster with KEDA installed checks it: against the
openAPIV3Schema of its CRD (vendored in schemas/, KEDA 2.20.2), read strictly as the API
server's strict field validation reads a structural schema (a field the schema does not
name is an error, not silently dropped), plus the CRD's CEL rule and the names the prometheus
scaler reads from a trigger's metadata, which the CRD leaves open."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jsonschema
import yaml

SCHEMA = Path(__file__).parent / "schemas" / "keda-scaledobject-v2.20.2.yaml"
API_VERSION = "keda.sh/v1alpha1"
#: The trigger metadata KEDA 2.20.2's prometheus scaler reads (pkg/scalers/prometheus_scaler.go,
#: its prometheusMetadata fields, and authModes of its authentication).
PROMETHEUS_METADATA = frozenset(
    {"serverAddress", "query", "queryParameters", "threshold", "activationThreshold"}
    | {"namespace", "customHeaders", "ignoreNullValues", "unsafeSsl", "awsRegion"}
    | {"timeout", "identityOwner", "authModes"}
)
PROMETHEUS_REQUIRED = frozenset({"serverAddress", "query", "threshold"})


def strict(schema: Any) -> Any:
    """``schema`` with every object that lists its properties closed to others, unless it says
    it keeps unknown fields."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: strict(value) for key, value in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        closed["additionalProperties"] = False
    return closed


@functools.cache
def validator() -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(strict(yaml.safe_load(SCHEMA.read_text())))


def check_scaled_object(doc: dict[str, Any]) -> None:
    """Raises jsonschema.ValidationError where the CRD's schema refuses ``doc``, ValueError
    where its CEL rule or a prometheus trigger's metadata does."""
    validator().validate(doc)
    if doc["apiVersion"] != API_VERSION or doc["kind"] != "ScaledObject":
        raise ValueError(f"not a {API_VERSION} ScaledObject: {doc['apiVersion']} {doc['kind']}")
    if not doc["metadata"].get("name"):
        raise ValueError("a ScaledObject needs a name")
    spec = doc["spec"]
    # The CRD's x-kubernetes-validations rule (a CEL expression), with its default of 100.
    if spec.get("minReplicaCount", 0) > spec.get("maxReplicaCount", 100):
        raise ValueError("minReplicaCount must be less than or equal to maxReplicaCount")
    for trigger in spec["triggers"]:
        if trigger["type"] == "prometheus":
            _check_prometheus(set(trigger["metadata"]))


def _check_prometheus(keys: set[str]) -> None:
    unknown, missing = keys - PROMETHEUS_METADATA, PROMETHEUS_REQUIRED - keys
    if unknown or missing:
        raise ValueError(f"prometheus metadata: unknown {sorted(unknown)}, lacks {sorted(missing)}")
