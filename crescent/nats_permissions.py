"""What each NATS user of a deployment may do: the subjects each role publishes and subscribes
to, for one instance (a user named by its node id) or for every instance of the role (a user
named after the role, ``ANY`` as the id). ``crescent.nats_config`` renders them for the server.

KV events name their publisher's role before its id (``subjects.kv_events``), so even a role's
shared user publishes only its own role's events: a tierd cannot speak for a node, nor the
relay of another engine for anything of Crescent's.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared import subjects
from shared.nats_auth import TOOLS, inbox_prefix

#: The KV index (``services.kvindex``): one instance per deployment, a user of its own.
KVINDEX = "kvindex"
#: The relays of other engines' KV events (``services.kvindex.relay``): every relay shares
#: this user, which publishes ``external`` events only.
RELAY = "kvindex-relay"
USERS = (*subjects.ROLES, KVINDEX, RELAY, TOOLS)
#: A role's users stand for every node of the role (``node_permissions(role, ANY)``).
ANY = "*"


@dataclass(frozen=True, slots=True)
class RolePermissions:
    """What one role may do on the bus; anything not listed is refused by the server.

    ``responds``: the role answers requests, so it may publish one reply to the reply subject of
    each request delivered to it (NATS's ``allow_responses``), and to no other inbox.
    """

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    responds: bool


def _node(role: str, me: str, user: str) -> RolePermissions:
    """A prefill or decode node ``me``: tasks, leases, pins, replays, its tierd's requests and
    resend requests of its KV events on its own subjects; tokens, lease releases and pins to
    anyone (a stream's chunks are tagged with the request's key, ``shared.stream_auth``, so
    writing is not enough); KV events as itself only."""
    publish = [
        subjects.tokens("*"),
        subjects.lease_releases("*"),
        subjects.peer_pins("*"),
        subjects.gateway_checks("*"),
        subjects.heartbeats(role, me),
        subjects.corrupt_reports("*"),
        subjects.kv_events(role, me),
    ]
    if role == "prefill":
        # A hand-off to a decode node that went unanswered is aborted there.
        publish[1:1] = [subjects.decode_tasks("*"), subjects.ABORTS]
        receives: tuple[str, ...] = (subjects.prefill_tasks(me),)
    else:
        receives = (subjects.decode_tasks(me), subjects.local_tasks(me))
    subscribe = (
        *receives,
        subjects.lease_releases(me),
        subjects.peer_pins(me),
        subjects.replays(me),
        subjects.ABORTS,
        # Their tierd asks them for cold blocks and says which ones it holds now.
        subjects.sinks(me),
        subjects.sunk(me),
        subjects.kv_resyncs(role, me),
        f"{inbox_prefix(user)}.>",
    )
    return RolePermissions(tuple(publish), subscribe, responds=True)


def _tierd(me: str, user: str) -> RolePermissions:
    """The tier daemon ``me`` of a host: asks its nodes for cold blocks and releases their
    leases; answers pins and prefetches of the blocks it holds, and reports of corrupt ones;
    publishes its tiers' KV events as a tierd, and takes the requests to resend them."""
    return RolePermissions(
        publish=(
            subjects.sinks("*"),
            subjects.sunk("*"),
            subjects.lease_releases("*"),
            subjects.heartbeats("tierd", me),
            subjects.kv_events("tierd", me),
        ),
        subscribe=(
            subjects.peer_pins(me),
            subjects.lease_releases(me),
            subjects.prefetches(me),
            subjects.corrupt_reports(me),
            subjects.kv_resyncs("tierd", me),
            subjects.HEARTBEATS_ALL,
            subjects.DISCONNECTS,
            f"{inbox_prefix(user)}.>",
        ),
        responds=True,
    )


def _gateway(me: str, user: str) -> RolePermissions:
    return RolePermissions(
        publish=(
            subjects.REQUESTS,
            subjects.ABORTS,
            subjects.replays("*"),
            subjects.heartbeats("gateway", me),
        ),
        subscribe=(
            f"{subjects.PREFIX}.tokens.>",
            subjects.HEARTBEATS_ALL,
            subjects.gateway_checks(me),
            subjects.DISCONNECTS,
            f"{inbox_prefix(user)}.>",
        ),
        responds=True,
    )


def _scheduler(me: str, user: str) -> RolePermissions:
    return RolePermissions(
        publish=(
            subjects.prefill_tasks("*"),
            subjects.local_tasks("*"),
            subjects.heartbeats("scheduler", me),
            subjects.ABORTS,
            subjects.prefetches("*"),
        ),
        subscribe=(
            # Only in the scheduler's queue group: a scheduler user cannot watch every
            # request without taking its share of them.
            f"{subjects.REQUESTS} {subjects.SCHEDULER_QUEUE}",
            subjects.HEARTBEATS_ALL,
            subjects.DISCONNECTS,
            f"{inbox_prefix(user)}.>",
        ),
        responds=True,
    )


def _kvindex(me: str, user: str) -> RolePermissions:
    """The KV index: hears every publisher's KV events, asks any of them to resend, and beats
    so status pages list it. It makes no requests, so it needs no inbox."""
    return RolePermissions(
        publish=(subjects.kv_resyncs("*", "*"), subjects.heartbeats(KVINDEX, me)),
        subscribe=(subjects.KV_EVENTS_ALL,),
        responds=False,
    )


def _relay(me: str, user: str) -> RolePermissions:
    """A relay of another engine's KV events: publishes them as ``external``, under any
    publisher id (each relay names its engine), and hears nothing (that engine cannot resend
    on request)."""
    return RolePermissions(
        publish=(subjects.kv_events(subjects.KV_EXTERNAL, "*"),), subscribe=(), responds=False
    )


def node_permissions(role: str, node_id: str, user: str = "") -> RolePermissions:
    """What the instance ``node_id`` of ``role`` may do, connected as ``user`` (default: the
    node id); ``node_id`` ``ANY`` gives the role-wide permissions of a role user."""
    user = user or node_id
    if role == TOOLS:
        return RolePermissions(publish=(), subscribe=(subjects.HEARTBEATS_ALL,), responds=False)
    if role in ("prefill", "decode"):
        return _node(role, node_id, user)
    builders = {
        "tierd": _tierd,
        "gateway": _gateway,
        "scheduler": _scheduler,
        KVINDEX: _kvindex,
        RELAY: _relay,
    }
    if role not in builders:
        raise ValueError(f"unknown role {role!r}")
    return builders[role](node_id, user)
