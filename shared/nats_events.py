"""What the NATS server says about connections: its DISCONNECT advisories.

The server publishes one on ``$SYS.ACCOUNT.<account>.DISCONNECT`` in its system account when a
client's connection closes, for any reason (a clean close, a crash, a SIGKILLed process whose
socket the kernel closed). The configuration Crescent generates imports them into the
deployment's account as ``shared.subjects.DISCONNECTS``.

An advisory names the connection twice: by the name the client chose (``crescent-<id>``, which
anyone can claim) and by the user the server authenticated. Only the second is evidence:
every service instance connects as the NATS user named by its node id
(``crescent.nats_config``), so the user is the node that went away.
"""

from __future__ import annotations

import json

DISCONNECT_TYPE = "io.nats.server.advisory.v1.client_disconnect"
NAME_PREFIX = "crescent-"


def _client(payload: bytes) -> dict[str, object] | None:
    try:
        advisory = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(advisory, dict) or advisory.get("type") != DISCONNECT_TYPE:
        return None
    client = advisory.get("client")
    return client if isinstance(client, dict) else None


def disconnected_name(payload: bytes) -> str | None:
    """The connection name the client gave itself (for logs only: anyone may choose any
    name); None for anything else: not JSON, another advisory, no client, no name."""
    client = _client(payload)
    name = client.get("name") if client is not None else None
    return name if isinstance(name, str) and name else None


def disconnected_user(payload: bytes) -> str | None:
    """The authenticated NATS user of the connection a DISCONNECT advisory is about; None
    for anything else or a connection without a user."""
    client = _client(payload)
    user = client.get("user") if client is not None else None
    return user if isinstance(user, str) and user else None


def disconnected_node(payload: bytes) -> str | None:
    """The node id whose connection closed, as the server vouches for it: the authenticated
    user (a service's user is its node id). A role-wide user (``prefill``) names no node, so
    liveness finds no peer under it and waits for heartbeats to time out instead."""
    return disconnected_user(payload)
