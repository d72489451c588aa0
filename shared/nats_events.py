"""What the NATS server says about connections: its DISCONNECT advisories.

The server publishes one on ``$SYS.ACCOUNT.<account>.DISCONNECT`` in its system account when a
client's connection closes, for any reason (a clean close, a crash, a SIGKILLed process whose
socket the kernel closed). The configuration ``crescent up`` generates imports them into the
deployment's account as ``shared.subjects.DISCONNECTS``. Services connect with the name
``crescent-<node id>``, so the advisory names the node that went away, at once rather than after
its heartbeats time out.
"""

from __future__ import annotations

import json

DISCONNECT_TYPE = "io.nats.server.advisory.v1.client_disconnect"
NAME_PREFIX = "crescent-"


def disconnected_name(payload: bytes) -> str | None:
    """The connection name of the client a DISCONNECT advisory is about; None for anything
    else: not JSON, another advisory, no client, or a client that gave no name."""
    try:
        advisory = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(advisory, dict) or advisory.get("type") != DISCONNECT_TYPE:
        return None
    client = advisory.get("client")
    if not isinstance(client, dict):
        return None
    name = client.get("name")
    return name if isinstance(name, str) and name else None


def disconnected_node(payload: bytes) -> str | None:
    """The node id of a Crescent service (connection ``crescent-<id>``) that disconnected;
    None for an advisory about any other client."""
    name = disconnected_name(payload)
    if name is None or not name.startswith(NAME_PREFIX) or name == NAME_PREFIX:
        return None
    return name[len(NAME_PREFIX) :]
