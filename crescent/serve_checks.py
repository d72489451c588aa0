"""What ``crescent serve`` checks before it starts a service: that every setting the role
needs is given and valid, and that the servers it names answer on their ports. Each finding
is one line that names the setting, so an operator fixes it before a service logs its way
into a restart loop."""

from __future__ import annotations

import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from pydantic import ValidationError

from shared.nats_auth import NatsAuthSettings
from shared.secrets import CacheMetaTokenSettings
from shared.service_settings import ServiceSettings
from shared.tls import TlsSettings

#: Roles that speak NATS (cachemeta alone does not).
NATS_ROLES = frozenset({"gateway", "scheduler", "prefill", "decode", "tierd", "kvindex"})
#: Roles that call cachemeta and so need its address.
CATALOGUE_CALLERS = frozenset({"scheduler", "prefill", "decode", "tierd"})
#: Roles that present (or, cachemeta, check) the catalogue's token.
TOKEN_ROLES = CATALOGUE_CALLERS | {"cachemeta", "kvindex"}
#: How long a server may take to accept a connection before it counts as unreachable.
CONNECT_TIMEOUT_S = 3.0
#: The flag that sets each required setting.
FLAGS = {"CRESCENT_NATS_URL": "--nats-url", "CRESCENT_CACHEMETA_URL": "--cachemeta-url"}


class Refused(Exception):
    """A check failed; the message is the one line to show. ``status``: 2 for a setting that
    is missing or invalid, 1 for a server that does not answer."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A server a role dials: what it is, the setting that names it, where it listens."""

    what: str
    setting: str
    host: str
    port: int


def check(role: str, env: Mapping[str, str], timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """``Refused`` at the first thing ``role`` lacks in ``env``, or the first server it names
    that does not accept a connection within ``timeout_s``."""
    required = ["CRESCENT_NATS_URL"] if role in NATS_ROLES else []
    required += ["CRESCENT_CACHEMETA_URL"] if role in CATALOGUE_CALLERS else []
    for setting in required:
        if not env.get(setting, "").strip():
            raise Refused(f"{setting} is not set ({FLAGS[setting]}): {role} needs it", 2)
    classes: list[type[ServiceSettings]] = [TlsSettings]
    classes += [NatsAuthSettings] if role in NATS_ROLES else []
    classes += [CacheMetaTokenSettings] if role in TOKEN_ROLES else []
    for settings in classes:
        _validate(settings, env)
    for endpoint in endpoints(role, env):
        _reach(endpoint, timeout_s)


def _validate(settings: type[ServiceSettings], env: Mapping[str, str]) -> None:
    try:
        settings.from_environ(env)
    except ValidationError as exc:
        # The settings' own messages name their variables and never a value.
        raise Refused(str(exc.errors()[0]["msg"]).removeprefix("Value error, "), 2) from None


def endpoints(role: str, env: Mapping[str, str]) -> Iterator[Endpoint]:
    """The servers ``role`` will dial, as ``env`` names them."""
    if role in NATS_ROLES:
        # A list of servers is a cluster: the first one stands for it here.
        first = env["CRESCENT_NATS_URL"].split(",")[0].strip()
        url = urlsplit(first if "://" in first else f"nats://{first}")
        yield Endpoint("NATS", "CRESCENT_NATS_URL", url.hostname or "", url.port or 4222)
    if role in CATALOGUE_CALLERS:
        host, _, port = env["CRESCENT_CACHEMETA_URL"].strip().rpartition(":")
        yield Endpoint("cachemeta", "CRESCENT_CACHEMETA_URL", host.strip("[]"), _port(port))
    if role == "tierd" and env.get("CRESCENT_S3_ENDPOINT", "").strip():
        url = urlsplit(env["CRESCENT_S3_ENDPOINT"].strip())
        default = 443 if url.scheme == "https" else 80
        yield Endpoint("S3", "CRESCENT_S3_ENDPOINT", url.hostname or "", url.port or default)
    if role == "cachemeta" and env.get("CRESCENT_DB_URL", "").startswith("postgresql"):
        url = urlsplit(env["CRESCENT_DB_URL"])
        yield Endpoint("Postgres", "CRESCENT_DB_URL", url.hostname or "", url.port or 5432)


def _port(text: str) -> int:
    return int(text) if text.isdigit() else 0


def _reach(endpoint: Endpoint, timeout_s: float) -> None:
    where = f"{endpoint.host}:{endpoint.port}"
    if not endpoint.host or not 0 < endpoint.port < 65536:
        raise Refused(f"{endpoint.setting} names no host and port of {endpoint.what}", 2)
    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s):
            return
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        message = f"cannot reach {endpoint.what} at {where} ({endpoint.setting}): {reason}"
        raise Refused(message, 1) from None
