"""Every NATS subject Crescent uses, in one place. Services meet only here and on the wire types
of ``shared.messages``."""

from __future__ import annotations

PREFIX = "crescent"

#: gateway -> scheduler: new requests, load-balanced over the scheduler queue group.
REQUESTS = f"{PREFIX}.requests"
SCHEDULER_QUEUE = "scheduler"

#: anyone -> everyone: a request was cancelled (client gone, deadline passed).
ABORTS = f"{PREFIX}.aborts"

#: every node -> scheduler: liveness and load, published every heartbeat interval.
HEARTBEATS = f"{PREFIX}.heartbeats"


def prefill_tasks(node_id: str) -> str:
    """scheduler -> one prefill node."""
    return f"{PREFIX}.prefill.{node_id}"


def decode_tasks(node_id: str) -> str:
    """prefill node -> one decode node: a finished prefill whose KV is ready to pull."""
    return f"{PREFIX}.decode.{node_id}"


def lease_releases(node_id: str) -> str:
    """decode node -> the prefill node holding a lease: the blocks were pulled (or given up)."""
    return f"{PREFIX}.leases.{node_id}"


def peer_pins(node_id: str) -> str:
    """prefill node -> a peer prefill node (request/reply): hold cached blocks for a pull."""
    return f"{PREFIX}.pins.{node_id}"


def tokens(request_id: str) -> str:
    """prefill and decode nodes -> the gateway serving the request: its output, in chunks."""
    return f"{PREFIX}.tokens.{request_id}"


def check_token(value: str, what: str) -> str:
    """Ids become subject tokens, so they must not contain NATS separators or wildcards."""
    if not value or any(c in value for c in ".*> \t\r\n"):
        raise ValueError(f"{what} {value!r} cannot be used in a NATS subject")
    return value
