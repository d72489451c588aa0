"""``crescent serve ROLE``: one service of a deployment, in the foreground, on a host of its own.

The service is ``python -m services.<role>`` (this process becomes it: signals, exit status and
supervision are the service's), started with the environment ``crescent up`` would give it
(``crescent.up_roles``): the stack's variables, then its role's and its instance's. The
addresses it meets the others at come from flags or their ``CRESCENT_*`` variables; its
identity and secrets from a copy of the folder ``crescent serve secrets DIR`` made once for
the whole deployment (``--secrets DIR``). Before it starts, every setting the role needs is
checked, and every server it will dial must accept a connection (``crescent.serve_checks``).

    crescent serve secrets /etc/crescent/secrets          # once; copy the folder to each host
    crescent serve decode --secrets /etc/crescent/secrets --node-id decode-0 --host-id c \\
        --nats-url nats://10.0.0.1:4222 --cachemeta-url 10.0.0.1:50051 --address 10.0.0.3
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from crescent import serve_checks, serve_secrets, up_tierd
from crescent.nats_config import KVINDEX
from crescent.serve_checks import Refused
from crescent.serve_secrets import SecretsFolder
from crescent.slots import SCALED, SlotSettings
from crescent.up_roles import id_variable, role_environment
from shared.service_settings import child_environment

ROLES = ("gateway", "scheduler", "prefill", "decode", "tierd", "cachemeta", "kvindex")
_HELP = {
    "gateway": "the OpenAI-compatible API",
    "scheduler": "placement of requests on prefill and decode nodes",
    "prefill": "a prefill node",
    "decode": "a decode node",
    "tierd": "this host's tiers below DRAM (NVMe, S3)",
    "cachemeta": "the catalogue of KV blocks (gRPC, on Postgres)",
    "kvindex": "the KV event index",
}
#: The variable each flag sets (the variable, when set and the flag is not, is used as is).
FLAG_SETTINGS = {
    "nats_url": "CRESCENT_NATS_URL",
    "cachemeta_url": "CRESCENT_CACHEMETA_URL",
    "s3_endpoint": "CRESCENT_S3_ENDPOINT",
    "host_id": "CRESCENT_HOST_ID",
}
#: What ``--address`` sets for each role: where it listens, or where its KV pull server
#: binds and what it announces to peers.
ADDRESS_SETTINGS = {
    "gateway": "CRESCENT_HOST",
    "cachemeta": "CRESCENT_CACHEMETA_HOST",
    "kvindex": "CRESCENT_KVINDEX_HOST",
    "prefill": "CRESCENT_TRANSFER_HOST",
    "decode": "CRESCENT_TRANSFER_HOST",
    "tierd": "CRESCENT_TRANSFER_HOST",
}
#: Roles that share this host's NVMe tier: tierd writes it, the nodes read it directly.
HOST_ROLES = frozenset({"prefill", "decode", "tierd"})
#: Roles that hash token ids, and so need the deployment's cache secret.
CACHE_SECRET_ROLES = frozenset({"scheduler", "prefill", "decode", "tierd", "kvindex"})


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="role", required=True, metavar="ROLE", parser_class=type(p))
    for role in ROLES:
        _add_role_flags(sub.add_parser(role, help=_HELP[role]))
    secrets = sub.add_parser(
        "secrets",
        help="write every secret of a deployment over several hosts into a folder, once "
        "(slots: CRESCENT_<ROLE>_SLOTS); copy it to every host",
    )
    secrets.add_argument("directory", type=Path, help="the folder (made mode 0700)")
    secrets.add_argument(
        "--ca-dir", type=Path, default=None, help="where the CA is kept (default: DIRECTORY-ca)"
    )


def _add_role_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--secrets", type=Path, metavar="DIR", help="this host's copy of the folder")
    p.add_argument("--node-id", help="the slot it runs as (prefill-0 ...); tierd: tierd-HOST_ID")
    p.add_argument("--nats-url", help="NATS server(s) (CRESCENT_NATS_URL)")
    p.add_argument("--cachemeta-url", help="cachemeta's host:port (CRESCENT_CACHEMETA_URL)")
    p.add_argument("--s3-endpoint", help="tierd's S3 server (CRESCENT_S3_ENDPOINT)")
    p.add_argument("--host-id", help="this host's name (CRESCENT_HOST_ID; default: hostname)")
    p.add_argument(
        "--address",
        help="this host's address between the hosts: KV pull servers bind and announce it; "
        "the gateway, cachemeta and kvindex listen on it",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=Path.home() / ".cache" / "crescent" / "serve",
        help="this host's NVMe tier goes in DATA_DIR/nvme unless CRESCENT_NVME_DIR is set",
    )
    p.add_argument(
        "--db-host",
        default="127.0.0.1:5432",
        help="cachemeta: the Postgres server of the folder's db-url, unless CRESCENT_DB_URL is set",
    )


def run(args: argparse.Namespace) -> int:
    if args.role == "secrets":
        return serve_secrets.write(args.directory, SlotSettings(), args.ca_dir, print)
    try:
        argv, env = prepare(args)
        serve_checks.check(args.role, env)
    except Refused as exc:
        sys.stderr.write(f"crescent serve {args.role}: error: {exc}\n")
        return exc.status
    who = env.get(id_variable(args.role)) or "an id of its own"
    sys.stderr.write(f"crescent serve {args.role}: python {' '.join(argv[1:])} as {who}\n")
    sys.stderr.flush()
    os.execvpe(argv[0], argv, env)


def prepare(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The command that runs ``args.role`` and its environment; ``Refused`` (status 2) for a
    folder or a node id that does not fit."""
    given = {var: getattr(args, flag) for flag, var in FLAG_SETTINGS.items()}
    env = child_environment({var: value for var, value in given.items() if value})
    if args.role in HOST_ROLES:
        up_tierd.apply_host_defaults(env, args.data_dir.expanduser().resolve())
    roles: dict[str, dict[str, str]] = {}
    node_id = args.node_id
    try:
        if args.secrets is not None:
            roles, node_id = _from_folder(args, env)  # the default id applied there
        else:
            node_id = node_id or _default_id(args.role, env)
    except ValueError as exc:
        raise Refused(str(exc), 2) from None
    own = {}
    if args.address and args.role in ADDRESS_SETTINGS:
        own[ADDRESS_SETTINGS[args.role]] = args.address
    argv = [sys.executable, "-m", f"services.{args.role}"]
    return argv, role_environment(env, roles, args.role, node_id, own)


def _default_id(role: str, env: dict[str, str]) -> str | None:
    """The id a role runs under when none is given: tierd's is its host's, kvindex has one."""
    if role == "tierd":
        return up_tierd.node_id(env)
    return KVINDEX if role == "kvindex" else None


def _from_folder(
    args: argparse.Namespace, env: dict[str, str]
) -> tuple[dict[str, dict[str, str]], str | None]:
    """What the secrets folder gives the role, and the node id it runs as."""
    folder = SecretsFolder(args.secrets)
    if not folder.directory.is_dir():
        raise ValueError(f"--secrets {folder.directory} is not a folder")
    roles = serve_secrets.roles_of(folder, env, CACHE_SECRET_ROLES)
    node_id = args.node_id
    if args.role in SCALED:
        node_id = serve_secrets.slot_of(folder, args.role, node_id)
    node_id = node_id or _default_id(args.role, env)
    if node_id is not None and args.role in serve_checks.NATS_ROLES:
        serve_secrets.require_identity(folder, roles, args.role, node_id)
    if args.role == "cachemeta" and not env.get("CRESCENT_DB_URL"):
        env["CRESCENT_DB_URL"] = folder.db_url(args.db_host)
    return roles, node_id
