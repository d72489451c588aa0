"""The secrets ``crescent up`` makes for the stack it runs, kept in ``<data dir>/secrets``
(mode 0700, every file 0600) and handed to the children through their environment, by file
where a service reads one. None of them is ever printed."""

from __future__ import annotations

from pathlib import Path

from crescent.nats_config import RELAY, TOOLS, NatsAuthFiles
from crescent.secret_files import new_secret, persistent_secret, private_dir, write_private
from crescent.up_kvindex import NAME as KVINDEX
from crescent.up_tierd import node_id as tierd_id

#: The stack's one gateway.
GATEWAY_ID = "gateway-0"
#: Roles that call cachemeta, and so get its token.
CACHEMETA_CALLERS = ("scheduler", "prefill", "decode", "tierd")
#: Who holds the catalogue's token: cachemeta's callers, and kvindex, which asks it of its own.
TOKEN_HOLDERS = (*CACHEMETA_CALLERS, KVINDEX)
#: Credentials for some other NATS server, which a NATS of our own must not inherit.
_NATS_CREDENTIALS = (
    "CRESCENT_NATS_USER",
    "CRESCENT_NATS_PASSWORD",
    "CRESCENT_NATS_PASSWORD_FILE",
    "CRESCENT_NATS_NKEY_SEED_FILE",
)


def secrets_dir(data_dir: Path) -> Path:
    return private_dir(data_dir / "secrets")


def apply_defaults(env: dict[str, str], directory: Path) -> None:
    """Development mode (unless the environment says otherwise) and a cache secret of this
    data dir's own, kept across runs so cached block hashes stay valid, unless one is given."""
    if not env.get("CRESCENT_DEV_MODE"):
        env["CRESCENT_DEV_MODE"] = "true"
    if not env.get("CRESCENT_CACHE_SECRET"):
        env["CRESCENT_CACHE_SECRET"] = persistent_secret(directory / "cache.secret")


def stack_nodes(env: dict[str, str], schedulers: int, prefill: int, decode: int) -> dict[str, str]:
    """Every service instance the stack runs, node id -> role: each gets a NATS user of its
    own, named by that id; and the user the relays of other engines' KV events share, which
    the stack starts none of (an operator runs one beside a vLLM engine)."""
    nodes = {GATEWAY_ID: "gateway"}
    nodes |= {f"scheduler-{i}": "scheduler" for i in range(schedulers)}
    nodes |= {f"prefill-{i}": "prefill" for i in range(prefill)}
    nodes |= {f"decode-{i}": "decode" for i in range(decode)}
    nodes[tierd_id(env)] = "tierd"
    nodes[KVINDEX] = KVINDEX
    nodes[RELAY] = RELAY
    return nodes


def nats_identities(env: dict[str, str], auth: NatsAuthFiles) -> dict[str, dict[str, str]]:
    """Each instance's NATS user and password file (by node id), for a NATS of our own."""
    for name in _NATS_CREDENTIALS:
        env.pop(name, None)
    return {user: auth.env(user) for user in auth.password_files if user not in (TOOLS, RELAY)}


def cachemeta_token(env: dict[str, str], directory: Path) -> dict[str, str]:
    """The token variables for cachemeta and its callers: a fresh token file per run, unless
    the environment already names a token (then everyone inherits it)."""
    if env.get("CRESCENT_CACHEMETA_TOKEN") or env.get("CRESCENT_CACHEMETA_TOKEN_FILE"):
        return {}
    path = write_private(directory / "cachemeta.token", new_secret() + "\n")
    return {"CRESCENT_CACHEMETA_TOKEN_FILE": str(path)}


def merge(roles: dict[str, dict[str, str]], extra: dict[str, str], *names: str) -> None:
    """Adds ``extra`` to the environment of each role in ``names``."""
    for name in names:
        roles[name] = roles.get(name, {}) | extra
