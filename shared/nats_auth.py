"""How a service proves who it is to NATS: a user and password, or an NKEY seed.

``NatsAuthSettings`` reads ``CRESCENT_NATS_USER`` with ``CRESCENT_NATS_PASSWORD`` or
``CRESCENT_NATS_PASSWORD_FILE``, or ``CRESCENT_NATS_NKEY_SEED_FILE``; ``connect_options`` turns
them into keyword arguments of ``nats.connect`` (and so of ``NatsBus.connect``).

A user's reply inbox is ``_INBOX.<user>``: the permissions ``crescent up`` generates let each
user subscribe to its own inboxes only, so nobody reads the replies another one asked for.

Each service instance connects as the user named by its node id (``crescent.nats_config``), so
the server's word on a connection (its disconnect advisories) names the node: ``own_id``
defaults a node id to that user, and ``NatsBus.connect`` refuses a per-node user connecting
under another id. A user named after a role (or ``tools``) stands for no node in particular.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Self

from pydantic import Field, PrivateAttr, SecretStr, model_validator

from shared import subjects
from shared.secrets import check_password, dev_mode, read_secret_file, refused
from shared.service_settings import ServiceSettings

INBOX = "_INBOX"
#: ``crescent up``'s readiness watcher and the benchmarks: they only watch heartbeats.
TOOLS = "tools"
#: Users that stand for no single node: a whole role's, and the read-only ``TOOLS``.
SHARED_USERS = frozenset((*subjects.ROLES, TOOLS))


def own_id(configured: str, user: str) -> str:
    """A service's id: ``configured`` if given, else its per-node NATS user, else ""."""
    return configured or ("" if user in SHARED_USERS else user)


def check_identity(node_id: str, user: str) -> None:
    """Refuses a per-node NATS user that connects under another node's id (its disconnects
    and heartbeat permissions would then speak for the wrong node)."""
    if user and user not in SHARED_USERS and user != node_id:
        raise ValueError(
            f"this service's id is {node_id!r} but its NATS user is {user!r}: a per-node user"
            " is its node's id (set CRESCENT_NATS_USER and the id to the same name)"
        )


def inbox_prefix(user: str) -> str:
    """The reply subjects of ``user``'s requests start with this (``_INBOX.<user>``)."""
    return f"{INBOX}.{user}"


class NatsAuthSettings(ServiceSettings):
    """The NATS credentials of one process.

    Invariant: after validation at most one way to authenticate is configured, a user always
    comes with a password (and a password with a user), and the password, wherever it came
    from, is held only as a ``SecretStr``: it never appears in a repr or a validation error.
    """

    nats_user: str = Field(default="", description="NATS user; empty: connect without one")
    nats_password: SecretStr | None = Field(default=None, description="the user's password")
    nats_password_file: Path | None = Field(
        default=None, description="a file holding the user's password"
    )
    nats_nkey_seed_file: Path | None = Field(
        default=None, description="an NKEY seed file, instead of a user and password"
    )
    _password: SecretStr | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _resolve_password(self) -> Self:
        given = self.nats_password.get_secret_value() if self.nats_password else ""
        if given and self.nats_password_file is not None:
            raise refused("set CRESCENT_NATS_PASSWORD or CRESCENT_NATS_PASSWORD_FILE, not both")
        password = given
        if self.nats_password_file is not None:
            try:
                password = read_secret_file(
                    self.nats_password_file, "the file CRESCENT_NATS_PASSWORD_FILE names"
                )
            except ValueError as exc:
                raise refused(str(exc)) from None
        if any(c in self.nats_user for c in ".*> \t\r\n"):
            raise refused("CRESCENT_NATS_USER must be one NATS subject token (no . * > or spaces)")
        if password:
            # After the file is read: a placeholder in a password file is refused too.
            check_password(password, "CRESCENT_NATS_PASSWORD", dev=dev_mode())
        if bool(self.nats_user) != bool(password):
            raise refused("CRESCENT_NATS_USER and a password (or password file) go together")
        if self.nats_nkey_seed_file is not None:
            if self.nats_user:
                raise refused("use an NKEY seed or a user and password, not both")
            if not self.nats_nkey_seed_file.expanduser().is_file():
                raise refused("the file CRESCENT_NATS_NKEY_SEED_FILE names does not exist")
        self._password = SecretStr(password) if password else None
        return self

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect``: nothing without credentials."""
        return connect_options(self)


def connect_options(auth: NatsAuthSettings) -> dict[str, Any]:
    """``auth`` as keyword arguments of ``nats.connect``: ``user``, ``password`` and the user's
    ``inbox_prefix``; or ``nkeys_seed`` (the seed file's path; nats-py then needs the ``nkeys``
    package); or nothing."""
    if auth.nats_nkey_seed_file is not None:
        return {"nkeys_seed": str(auth.nats_nkey_seed_file.expanduser())}
    password = auth._password
    if not auth.nats_user or password is None:
        return {}
    return {
        "user": auth.nats_user,
        "password": password.get_secret_value(),
        "inbox_prefix": inbox_prefix(auth.nats_user),
    }
