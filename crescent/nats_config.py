"""The NATS server configuration of a deployment: one user per role, each allowed exactly the
subjects its role publishes and subscribes to, and the server's disconnect advisories imported
for the services.

Used by ``crescent up`` (random passwords in private files), by docker-compose (passwords from
the environment, see ``EnvRef``) and by tests that run NATS with authentication on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from crescent.secret_files import new_secret, private_dir, write_private
from shared import subjects
from shared.nats_auth import inbox_prefix
from shared.secrets import read_secret_file

ACCOUNT = "CRESCENT"
SYSTEM_ACCOUNT = "SYS"
#: ``crescent up``'s readiness watcher and the benchmarks: they only watch heartbeats.
TOOLS = "tools"
USERS = (*subjects.ROLES, TOOLS)
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


def _node(role: str, *receives: str) -> RolePermissions:
    """Prefill and decode nodes: tasks on their own subject, leases, pins, replays and their
    tierd's requests."""
    publish = [
        subjects.tokens("*"),
        subjects.lease_releases("*"),
        subjects.peer_pins("*"),
        subjects.gateway_checks("*"),
        subjects.heartbeats(role, "*"),
        subjects.corrupt_reports("*"),
    ]
    if role == "prefill":
        # A hand-off to a decode node that went unanswered is aborted there.
        publish[1:1] = [subjects.decode_tasks("*"), subjects.ABORTS]
    subscribe = (
        *receives,
        subjects.lease_releases("*"),
        subjects.peer_pins("*"),
        subjects.replays("*"),
        subjects.ABORTS,
        # Their tierd asks them for cold blocks and says which ones it holds now.
        subjects.sinks("*"),
        subjects.sunk("*"),
        f"{inbox_prefix(role)}.>",
    )
    return RolePermissions(tuple(publish), subscribe, responds=True)


def _tierd() -> RolePermissions:
    """The tier daemon of a host: asks its nodes for cold blocks and releases their leases;
    answers pins and prefetches of the blocks it holds, and reports of corrupt ones."""
    return RolePermissions(
        publish=(
            subjects.sinks("*"),
            subjects.sunk("*"),
            subjects.lease_releases("*"),
            subjects.heartbeats("tierd", "*"),
        ),
        subscribe=(
            subjects.peer_pins("*"),
            subjects.lease_releases("*"),
            subjects.prefetches("*"),
            subjects.corrupt_reports("*"),
            subjects.HEARTBEATS_ALL,
            subjects.DISCONNECTS,
            f"{inbox_prefix('tierd')}.>",
        ),
        responds=True,
    )


def permissions() -> dict[str, RolePermissions]:
    """Every user's permissions, by user name (the role)."""
    return {
        "gateway": RolePermissions(
            publish=(
                subjects.REQUESTS,
                subjects.ABORTS,
                subjects.replays("*"),
                subjects.heartbeats("gateway", "*"),
            ),
            subscribe=(
                f"{subjects.PREFIX}.tokens.>",
                subjects.HEARTBEATS_ALL,
                subjects.gateway_checks("*"),
                subjects.DISCONNECTS,
                f"{inbox_prefix('gateway')}.>",
            ),
            responds=True,
        ),
        "scheduler": RolePermissions(
            publish=(
                subjects.prefill_tasks("*"),
                subjects.local_tasks("*"),
                subjects.heartbeats("scheduler", "*"),
                subjects.ABORTS,
                subjects.prefetches("*"),
            ),
            subscribe=(
                # Only in the scheduler's queue group: a scheduler user cannot watch every
                # request without taking its share of them.
                f"{subjects.REQUESTS} {subjects.SCHEDULER_QUEUE}",
                subjects.HEARTBEATS_ALL,
                subjects.DISCONNECTS,
                f"{inbox_prefix('scheduler')}.>",
            ),
            responds=True,
        ),
        "prefill": _node("prefill", subjects.prefill_tasks("*")),
        "decode": _node("decode", subjects.decode_tasks("*"), subjects.local_tasks("*")),
        "tierd": _tierd(),
        TOOLS: RolePermissions(publish=(), subscribe=(subjects.HEARTBEATS_ALL,), responds=False),
    }


@dataclass(frozen=True, slots=True)
class EnvRef:
    """A value the NATS server reads from its environment variable ``name`` at start."""

    name: str


Password = str | EnvRef


def _render(value: object, indent: str = "") -> str:
    """NATS configuration syntax: JSON plus unquoted ``$VARIABLE`` references."""
    inner = indent + "  "
    if isinstance(value, EnvRef):
        return f"${value.name}"
    if isinstance(value, dict):
        items = "".join(f"{inner}{k}: {_render(v, inner)}\n" for k, v in value.items())
        return "{\n" + items + indent + "}"
    if isinstance(value, list | tuple):
        if all(isinstance(v, str) for v in value):
            return "[" + ", ".join(json.dumps(v) for v in value) + "]"
        items = "".join(f"{inner}{_render(v, inner)}\n" for v in value)
        return "[\n" + items + indent + "]"
    return json.dumps(value)


def _user(name: str, password: Password, allowed: RolePermissions) -> dict[str, object]:
    perms: dict[str, object] = {
        # An empty allow list would allow everything; a role that publishes nothing is denied.
        "publish": {"allow": list(allowed.publish)} if allowed.publish else {"deny": [">"]},
        "subscribe": {"allow": list(allowed.subscribe)},
    }
    if allowed.responds:
        perms["allow_responses"] = {"max": 1, "expires": RESPONSE_WINDOW}
    return {"user": name, "password": password, "permissions": perms}


def render_config(
    passwords: Mapping[str, Password],
    *,
    listen: str | None = None,
    http: str | None = None,
    jetstream: bool = False,
) -> str:
    """The server configuration for the users in ``passwords`` (a subset of ``USERS``).
    ``listen``/``http``: client and monitoring addresses (else the command line's);
    ``jetstream``: the deployment's account may use JetStream (the server needs ``-js``)."""
    rules = permissions()
    account: dict[str, object] = {
        "users": [_user(name, pw, rules[name]) for name, pw in passwords.items()],
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
    config["system_account"] = SYSTEM_ACCOUNT
    config["accounts"] = {
        SYSTEM_ACCOUNT: {"exports": [{"stream": DISCONNECT_ADVISORIES}]},
        ACCOUNT: account,
    }
    header = "# Crescent's NATS: one user per role, each confined to its role's subjects.\n"
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

    def connect_options(self, user: str) -> dict[str, str]:
        """Keyword arguments of ``nats.connect`` (or ``NatsBus.connect``) for ``user``."""
        return {
            "user": user,
            "password": read_secret_file(self.password_files[user]),
            "inbox_prefix": inbox_prefix(user),
        }


def write_nats_auth(
    directory: Path, *, listen: str | None = None, jetstream: bool = False
) -> NatsAuthFiles:
    """Fresh random passwords for every user, their files and the configuration, in
    ``directory`` (made private)."""
    private_dir(directory)
    passwords = {user: new_secret() for user in USERS}
    files = {
        user: write_private(directory / f"nats-{user}.password", password + "\n")
        for user, password in passwords.items()
    }
    config = render_config(dict(passwords), listen=listen, jetstream=jetstream)
    return NatsAuthFiles(write_private(directory / "nats.conf", config), files)


def password_variable(user: str) -> str:
    """The environment variable a NATS container reads ``user``'s password from."""
    return f"CRESCENT_NATS_{user.upper()}_PASSWORD"


def compose_config() -> str:
    """The configuration docker-compose.yml gives its NATS container: the services' users with
    passwords from the container's environment, monitoring only on the container's loopback
    (for its health check). Compose needs every ``$`` doubled."""
    users = {role: EnvRef(password_variable(role)) for role in subjects.ROLES}
    return render_config(users, listen="0.0.0.0:4222", http="127.0.0.1:8222")
