"""NATS identities of a container deployment, made before its replicas exist: a fixed number of
slots per scalable role, each a node id with a NATS user of the same name.

docker-compose.yml: ``crescent secrets compose`` makes one password per slot (``prefill-0`` …)
and lists the slots in the secrets folder; each replica claims a free one at start
(``crescent.slot_claim``). Kubernetes: a StatefulSet's pods are the slots (``crescent-prefill-0``
…), so a pod's name is its node id and its NATS user.

The gateway publishes a fixed host port in compose, so docker-compose.yml makes one slot for
it; tierd has one per host, named ``tierd-<host id>`` (the name its nodes address it by).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from pydantic import Field

from shared import subjects
from shared.secrets import read_secret_file
from shared.service_settings import ServiceSettings

#: The roles whose replicas are counted in slots, in the order they are listed.
SCALED = ("gateway", "scheduler", "prefill", "decode")
#: The file of the secrets folder that lists each role's slots (JSON: role -> node ids).
SLOTS_FILE = "nats-slots"


class SlotSettings(ServiceSettings):
    """How many replicas of each role a deployment can run, one NATS identity each.
    Invariant: every count is at least 1."""

    gateway_slots: int = Field(
        default=2,
        ge=1,
        description="gateway NATS identities made for a container deployment (compose: 1)",
    )
    scheduler_slots: int = Field(
        default=2, ge=1, description="scheduler NATS identities made for a container deployment"
    )
    prefill_slots: int = Field(
        default=4, ge=1, description="prefill NATS identities made for a container deployment"
    )
    decode_slots: int = Field(
        default=4, ge=1, description="decode NATS identities made for a container deployment"
    )

    def count(self, role: str) -> int:
        value: int = getattr(self, f"{role}_slots")
        return value


def setting_name(role: str) -> str:
    """The variable that sets ``role``'s slot count."""
    return f"CRESCENT_{role.upper()}_SLOTS"


def compose_nodes(slots: SlotSettings, host_id: str) -> dict[str, str]:
    """Every node id of a compose stack -> its role: ``<role>-<i>`` per slot, and the host's
    tierd."""
    nodes = {f"{role}-{i}": role for role in SCALED for i in range(slots.count(role))}
    nodes[f"tierd-{subjects.host_id(host_id)}"] = "tierd"
    return nodes


def pod_nodes(slots: SlotSettings, prefix: str = "crescent-") -> dict[str, str]:
    """Every StatefulSet pod a Kubernetes deployment may run -> its role: the pods of
    ``<prefix><role>`` are named ``<prefix><role>-<ordinal>``."""
    return {f"{prefix}{role}-{i}": role for role in SCALED for i in range(slots.count(role))}


def slot_listing(nodes: Mapping[str, str]) -> str:
    """The slots file's text: each role's node ids, in slot order."""
    listing: dict[str, list[str]] = {}
    for node_id, role in nodes.items():
        listing.setdefault(role, []).append(node_id)
    return json.dumps(listing, indent=2) + "\n"


def read_slots(directory: Path, role: str) -> list[str]:
    """``role``'s node ids, as the secrets folder ``directory`` lists them."""
    text = read_secret_file(directory / SLOTS_FILE, f"the slots file {directory / SLOTS_FILE}")
    try:
        listing = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"{directory / SLOTS_FILE} is not a slots file") from None
    ids = listing.get(role) if isinstance(listing, dict) else None
    if not ids or not all(isinstance(i, str) for i in ids):
        raise ValueError(
            f"{directory / SLOTS_FILE} lists no {role} slot; run `crescent secrets compose` again"
        )
    return [subjects.check_token(i, "node id") for i in ids]
