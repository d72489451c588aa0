"""The NATS server configuration of a deployment: one user per service instance, named by its
node id, each allowed exactly the subjects that instance publishes and subscribes to (its own
heartbeat subject, the subjects addressed to it: ``crescent.nats_permissions``), and the
server's disconnect advisories imported for the services.

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

from crescent.nats_permissions import ANY, USERS, RolePermissions, node_permissions
from crescent.nats_permissions import KVINDEX as KVINDEX
from crescent.nats_permissions import RELAY as RELAY
from crescent.nats_tls import tls_section
from crescent.secret_files import new_secret, private_dir, write_private
from shared import subjects
from shared.nats_auth import TOOLS, inbox_prefix
from shared.secrets import read_secret_file

ACCOUNT = "CRESCENT"
SYSTEM_ACCOUNT = "SYS"
DISCONNECT_ADVISORIES = f"$SYS.ACCOUNT.{ACCOUNT}.DISCONNECT"
#: A responder may answer each request it received once, within this long.
RESPONSE_WINDOW = "2m"


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
    # An empty allow list would allow everything: a role that publishes (or hears) nothing is
    # denied everything instead.
    perms: dict[str, object] = {
        "publish": {"allow": list(allowed.publish)} if allowed.publish else {"deny": [">"]},
        "subscribe": {"allow": list(allowed.subscribe)} if allowed.subscribe else {"deny": [">"]},
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
    roles: tuple[str, ...] = (),
    listen: str | None = None,
    jetstream: bool = False,
) -> NatsAuthFiles:
    """Fresh random passwords, their files and the configuration, in ``directory`` (made
    private): one user per node in ``nodes`` (node id -> role), one per role in ``roles``
    (names of ``USERS``, as Kubernetes' tierd or the relays) and ``TOOLS``; without
    ``nodes``, one user per role instead."""
    private_dir(directory)
    names = tuple(dict.fromkeys((*nodes, *roles, TOOLS))) if nodes else USERS
    for name in names:
        subjects.check_token(name, "NATS user")
    passwords = {user: new_secret() for user in names}
    files = {
        user: write_private(directory / f"nats-{user}.password", password + "\n")
        for user, password in passwords.items()
    }
    config = render_config(dict(passwords), nodes=nodes, listen=listen, jetstream=jetstream)
    return NatsAuthFiles(write_private(directory / "nats.conf", config), files)
