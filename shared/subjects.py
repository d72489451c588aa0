"""Every NATS subject Crescent uses, in one place. Services meet only here and on the wire types
of ``shared.messages``.

Hand-offs that move a request between services are NATS request/reply: the receiver answers
once it owns the work (``SubmitReply``, ``TaskAck``), so a sender always knows whether its
hand-off landed and places it elsewhere when it did not. Subjects that name a node or a
gateway end in its id, which lets NATS permissions confine each role to its own subjects.
"""

from __future__ import annotations

import socket

PREFIX = "crescent"

#: gateway -> scheduler (request/reply, queue group ``SCHEDULER_QUEUE``): a GenerateRequest;
#: the reply (SubmitReply) comes once a prefill node has accepted it, or says why not.
REQUESTS = f"{PREFIX}.requests"
SCHEDULER_QUEUE = "scheduler"

#: anyone -> everyone: a request was cancelled (client gone, deadline passed, resumed elsewhere).
ABORTS = f"{PREFIX}.aborts"

#: every service -> everyone: liveness and load, on ``heartbeats.<role>.<id>``.
HEARTBEATS = f"{PREFIX}.heartbeats"
HEARTBEATS_ALL = f"{HEARTBEATS}.>"

#: the NATS server -> everyone: a client connection closed (its system account's DISCONNECT
#: advisory, imported into the deployment's account under this name where configured).
DISCONNECTS = f"{PREFIX}.events.disconnect"

ROLES = ("gateway", "scheduler", "prefill", "decode", "tierd")

#: every publisher of catalogue changes -> anyone: its numbered KV events (``KvEventFrame``,
#: ``shared.kv_events``) on ``kv.events.<role>.<publisher id>``; a node publishes its DRAM
#: pool's, a tierd its NVMe and S3 tiers', a relay another engine's (vLLM's) as ``external``.
#: The role leads, as in heartbeats, so a user shared by a role's replicas (Kubernetes' tierd)
#: can be confined to its own role's subjects and never speak for a node.
KV_EVENTS = f"{PREFIX}.kv.events"
KV_EVENTS_ALL = f"{KV_EVENTS}.>"
KV_EXTERNAL = "external"
KV_EVENT_ROLES = ("prefill", "decode", "tierd", KV_EXTERNAL)


def heartbeats(role: str, node_id: str) -> str:
    """Where ``node_id`` of ``role`` publishes its NodeStatus."""
    return f"{HEARTBEATS}.{role}.{node_id}"


def prefill_tasks(node_id: str) -> str:
    """scheduler -> one prefill node (request/reply): a PrefillTask, answered by a TaskAck."""
    return f"{PREFIX}.prefill.{node_id}"


def decode_tasks(node_id: str) -> str:
    """prefill node -> one decode node (request/reply): a KVHandoff, answered by a TaskAck."""
    return f"{PREFIX}.decode.{node_id}"


def local_tasks(node_id: str) -> str:
    """scheduler -> one decode node (request/reply): a PrefillTask to compute there, with no
    hand-off (a short prompt, or one the node already caches), answered by a TaskAck."""
    return f"{PREFIX}.local.{node_id}"


def lease_releases(node_id: str) -> str:
    """puller -> the node holding a lease: the blocks were pulled (or given up)."""
    return f"{PREFIX}.leases.{node_id}"


def peer_pins(node_id: str) -> str:
    """puller -> a node caching blocks (request/reply): hold them for a pull."""
    return f"{PREFIX}.pins.{node_id}"


def sinks(node_id: str) -> str:
    """tierd -> a node on its host (request/reply): offer me your coldest cached blocks that
    no lower tier holds yet (a SinkRequest, answered by a SinkOffer)."""
    return f"{PREFIX}.sink.{node_id}"


def sunk(node_id: str) -> str:
    """tierd -> the node that offered blocks: these are written below DRAM now (SinkDone)."""
    return f"{PREFIX}.sunk.{node_id}"


def prefetches(tierd_id: str) -> str:
    """scheduler -> a tierd: bring these blocks up a tier while their request waits."""
    return f"{PREFIX}.prefetch.{tierd_id}"


def corrupt_reports(tierd_id: str) -> str:
    """node -> a tierd: blocks read from its files directly did not verify (CorruptBlocks)."""
    return f"{PREFIX}.corrupt.{tierd_id}"


def replays(node_id: str) -> str:
    """gateway -> the node serving a request (request/reply): its output from a position on,
    to fill a gap in the stream or to learn whether the node still has the request."""
    return f"{PREFIX}.replay.{node_id}"


def kv_events(role: str, publisher_id: str) -> str:
    """Where ``publisher_id`` of ``role`` (one of ``KV_EVENT_ROLES``) publishes its KV events
    (``KV_EVENTS`` says what they are)."""
    return f"{KV_EVENTS}.{role}.{publisher_id}"


def kv_resyncs(role: str, publisher_id: str) -> str:
    """a listener of KV events -> their publisher: a ``KvResyncRequest`` (send every tier
    cleared, then whole), after the listener missed some of its events."""
    return f"{PREFIX}.kv.resync.{role}.{publisher_id}"


def kv_publisher(role: str, publisher_id: str) -> str:
    """The name a listener knows a publisher of KV events by: its role and id, as its
    subjects carry them (an id alone may be claimed under two roles)."""
    return f"{role}.{publisher_id}"


def tokens(request_id: str) -> str:
    """prefill and decode nodes -> the gateway serving the request: its output, in chunks."""
    return f"{PREFIX}.tokens.{request_id}"


def gateway_checks(gateway_id: str) -> str:
    """node -> the gateway a request came from (request/reply): which of these ids do you still
    wait for? No responder means the gateway is gone, and so are its clients."""
    return f"{PREFIX}.gateway.{gateway_id}.check"


def host_id(configured: str = "") -> str:
    """The name of the machine a service runs on, as heartbeats carry it: ``configured``
    (``CRESCENT_HOST_ID``) or the hostname, with characters a subject cannot hold replaced."""
    name = configured or socket.gethostname() or "localhost"
    return check_token("".join("-" if c in ".*> \t\r\n" else c for c in name), "host id")


def check_token(value: str, what: str) -> str:
    """Ids become subject tokens, so they must not contain NATS separators or wildcards."""
    if not value or any(c in value for c in ".*> \t\r\n"):
        raise ValueError(f"{what} {value!r} cannot be used in a NATS subject")
    return value
