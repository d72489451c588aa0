"""The NATS server configuration of a deployment: one user per service instance, named by its
node id, each allowed exactly the subjects that instance publishes and subscribes to (its own
heartbeat subject, the subjects addressed to it), and the server's disconnect advisories
imported for the services.

A user named after a role instead of a node (``prefill``) holds the role-wide permissions
(every node id of the role): that is what a deployment that cannot tell its replicas apart
gets, and liveness then ignores its disconnects (``shared.liveness``), since they name no node.

Used by ``crescent up`` (random passwords in private files), by ``crescent secrets`` (the
compose and Kubernetes slots, ``crescent.secrets_init``) and by tests that run NATS with
authentication on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crescent.nats_tls import tls_section
from crescent.secret_files import new_secret, private_dir, write_private
from shared import subjects
from shared.nats_auth import TOOLS, inbox_prefix
from shared.secrets import read_secret_file

ACCOUNT = "CRESCENT"
SYSTEM_ACCOUNT = "SYS"
#: The KV index (``services.kvindex``): one instance per deployment, a user of its own.
KVINDEX = "kvindex"
USERS = (*subjects.ROLES, KVINDEX, TOOLS)
#: A role's users stand for every node of the role (``node_permissions(role, ANY)``).
ANY = "*"
DISCONNECT_ADVISORIES = f"$SYS.ACCOUNT.{ACCOUNT}.DISCONNECT"
#: A responder may answer each request it received once, within this long.
RESPONSE_WINDOW = "2m"


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
        subjects.kv_events(me),
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
        subjects.kv_resyncs(me),
        f"{inbox_prefix(user)}.>",
    )
    return RolePermissions(tuple(publish), subscribe, responds=True)


def _tierd(me: str, user: str) -> RolePermissions:
    """The tier daemon ``me`` of a host: asks its nodes for cold blocks and releases their
    leases; answers pins and prefetches of the blocks it holds, and reports of corrupt ones;
    publishes its tiers' KV events as itself, and takes the requests to resend them."""
    return RolePermissions(
        publish=(
            subjects.sinks("*"),
            subjects.sunk("*"),
            subjects.lease_releases("*"),
            subjects.heartbeats("tierd", me),
            subjects.kv_events(me),
        ),
        subscribe=(
            subjects.peer_pins(me),
            subjects.lease_releases(me),
            subjects.prefetches(me),
            subjects.corrupt_reports(me),
            subjects.kv_resyncs(me),
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
    """The KV index: hears every publisher's KV events and asks any of them to resend. It
    makes no requests, so it needs no inbox, and sends nothing else."""
    return RolePermissions(
        publish=(subjects.kv_resyncs("*"),), subscribe=(subjects.KV_EVENTS_ALL,), responds=False
    )


def node_permissions(role: str, node_id: str, user: str = "") -> RolePermissions:
    """What the instance ``node_id`` of ``role`` may do, connected as ``user`` (default: the
    node id); ``node_id`` ``ANY`` gives the role-wide permissions of a role user."""
    user = user or node_id
    if role == TOOLS:
        return RolePermissions(publish=(), subscribe=(subjects.HEARTBEATS_ALL,), responds=False)
    if role in ("prefill", "decode"):
        return _node(role, node_id, user)
    builders = {"tierd": _tierd, "gateway": _gateway, "scheduler": _scheduler, KVINDEX: _kvindex}
    if role not in builders:
        raise ValueError(f"unknown role {role!r}")
    return builders[role](node_id, user)


def _render(value: object, indent: str = "") -> str:
    """NATS configuration syntax (a superset of JSON)."""
    inner = indent + "  "
    if isinstance(value, dict):
        items = "".join(f"{inner}{k}: {_render(v, inner)}\n" for k, v in value.items())
        return "{\n" + items + indent + "}"
    if isinstance(value, list | tuple):
        if all(isinstance(v, str) for v in value):
            return "[" + ", ".join(json.dumps(v) for v in value) + "]"
        items = "".join(f"{inner}{_render(v, inner)}\n" for v in value)
        return "[\n" + items + indent + "]"
    return json.dumps(value)


def _user(name: str, password: str, allowed: RolePermissions) -> dict[str, object]:
    perms: dict[str, object] = {
        # An empty allow list would allow everything; a role that publishes nothing is denied.
        "publish": {"allow": list(allowed.publish)} if allowed.publish else {"deny": [">"]},
        "subscribe": {"allow": list(allowed.subscribe)},
    }
    if allowed.responds:
        perms["allow_responses"] = {"max": 1, "expires": RESPONSE_WINDOW}
    return {"user": name, "password": password, "permissions": perms}


def render_config(
    passwords: Mapping[str, str],
    *,
    nodes: Mapping[str, str] | None = None,
    listen: str | None = None,
    http: str | None = None,
    jetstream: bool = False,
) -> str:
    """The server configuration for the users in ``passwords``: each user in ``nodes`` (node
    id -> role) is that node, any other must be a role's name (``USERS``) and stands for the
    whole role. ``listen``/``http``: client and monitoring addresses (else the command
    line's); ``jetstream``: the deployment's account may use JetStream (the server needs
    ``-js``)."""
    nodes = nodes or {}
    users = []
    for name, password in passwords.items():
        if name in nodes:
            allowed = node_permissions(nodes[name], name)
        elif name in USERS:
            allowed = node_permissions(name, ANY, name)
        else:
            raise ValueError(f"NATS user {name!r} is neither a node nor a role")
        users.append(_user(name, password, allowed))
    account: dict[str, object] = {
        "users": users,
        # The advisories arrive in the deployment's account as an ordinary subject; no user
        # may publish on it, so a disconnect event cannot be forged.
        "imports": [
            {
                "stream": {"account": SYSTEM_ACCOUNT, "subject": DISCONNECT_ADVISORIES},
                "to": subjects.DISCONNECTS,
            }
        ],
    }
    if jetstream:
        account["jetstream"] = "enabled"
    config: dict[str, object] = {}
    if listen is not None:
        config["listen"] = listen
    if http is not None:
        config["http"] = http
    config |= tls_section()
    config["system_account"] = SYSTEM_ACCOUNT
    config["accounts"] = {
        SYSTEM_ACCOUNT: {"exports": [{"stream": DISCONNECT_ADVISORIES}]},
        ACCOUNT: account,
    }
    header = "# Crescent's NATS: one user per node (or role), confined to its own subjects.\n"
    return header + "\n".join(f"{k}: {_render(v)}" for k, v in config.items()) + "\n"


@dataclass(frozen=True, slots=True)
class NatsAuthFiles:
    """A generated configuration and the password file of every user, all mode 0600 in a
    0700 folder. Invariant: each password file holds the password ``config`` gives its user."""

    config: Path
    password_files: dict[str, Path]

    def env(self, user: str) -> dict[str, str]:
        """The variables that make a Crescent process connect as ``user``."""
        return {
            "CRESCENT_NATS_USER": user,
            "CRESCENT_NATS_PASSWORD_FILE": str(self.password_files[user]),
        }

    def connect_options(self, user: str) -> dict[str, Any]:
        """Keyword arguments of ``nats.connect`` (or ``NatsBus.connect``) for ``user``."""
        return {
            "user": user,
            "password": read_secret_file(self.password_files[user]),
            "inbox_prefix": inbox_prefix(user),
        }


def write_nats_auth(
    directory: Path,
    *,
    nodes: Mapping[str, str] | None = None,
    listen: str | None = None,
    jetstream: bool = False,
) -> NatsAuthFiles:
    """Fresh random passwords, their files and the configuration, in ``directory`` (made
    private): one user per node in ``nodes`` (node id -> role) and ``TOOLS``; without
    ``nodes``, one user per role instead."""
    private_dir(directory)
    names = (*nodes, TOOLS) if nodes else USERS
    for name in names:
        subjects.check_token(name, "NATS user")
    passwords = {user: new_secret() for user in names}
    files = {
        user: write_private(directory / f"nats-{user}.password", password + "\n")
        for user, password in passwords.items()
    }
    config = render_config(dict(passwords), nodes=nodes, listen=listen, jetstream=jetstream)
    return NatsAuthFiles(write_private(directory / "nats.conf", config), files)
