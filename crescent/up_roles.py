"""The environment one service process starts with, shared by ``crescent up`` (every service
of one host, as its children) and ``crescent serve`` (one service, on a host of its own).

Both build the same two things first: the stack's common variables (``env``) and, in
``roles``, what each role and each instance adds to them (its NATS user, the catalogue's
token, tierd's S3 keys), keyed by role name or by node id. A service's environment is then
always made the same way, here.
"""

from __future__ import annotations

from collections.abc import Mapping

#: The variable that carries an instance's id, where it is not ``CRESCENT_NODE_ID``.
ID_VARIABLES = {"gateway": "CRESCENT_GATEWAY_ID", "scheduler": "CRESCENT_SCHEDULER_ID"}
NODE_ID = "CRESCENT_NODE_ID"


def id_variable(role: str) -> str:
    """The variable that names an instance of ``role``."""
    return ID_VARIABLES.get(role, NODE_ID)


def role_environment(
    env: Mapping[str, str],
    roles: Mapping[str, Mapping[str, str]],
    role: str,
    node_id: str | None = None,
    own: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """``env`` with what ``roles`` gives ``role``, then what it gives the instance ``node_id``
    (whose id it also sets; None: the service picks its own), then ``own`` (its ports and
    addresses). Later layers win: an instance's NATS user over its role's."""
    result = dict(env) | dict(roles.get(role, {}))
    if node_id is not None:
        result |= roles.get(node_id, {})
        result[id_variable(role)] = node_id
    return result | dict(own or {})
