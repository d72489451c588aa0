"""``crescent secrets``: generate a container deployment's secrets, and start a process with
secrets read from files into the variables of settings that have no ``*_FILE`` twin.

    crescent secrets compose /var/lib/crescent/secrets   (docker-compose.yml's secrets-init)
    crescent secrets k8s | kubectl create -f -           (once, before `kubectl apply -k`)
    crescent secrets k8s --tls-only --ca-dir DIR | kubectl -n crescent replace -f -   (renew)
    crescent secrets exec --env CRESCENT_CACHE_SECRET=/path -- python -m services.scheduler
    crescent secrets exec --claim prefill -- python -m services.prefill   (a compose replica)
    crescent secrets exec --pod-slot prefill -- python -m services.prefill   (a StatefulSet pod)
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

from crescent import secrets_init, slot_claim
from crescent.cli_settings import CliSettings
from crescent.secrets_init import SecretPlan
from crescent.slots import SCALED, SlotSettings, setting_name
from shared.secrets import read_secret_file
from shared.service_settings import child_environment

_USERS_HELP = "NATS users (role names) to make passwords for, instead of one per slot"


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("at least 1")
    return value


def _add_slot_flags(p: argparse.ArgumentParser) -> None:
    for role in SCALED:
        p.add_argument(
            f"--{role}-slots",
            type=_count,
            metavar="N",
            help=f"{role} replicas the deployment may run (default: {setting_name(role)} "
            f"or {SlotSettings.model_fields[f'{role}_slots'].default})",
        )
    p.add_argument("--nats-user", action="append", dest="nats_users", help=_USERS_HELP)


def _add_exec(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser("exec", help="run a command with variables read from secret files")
    run.add_argument(
        "--claim",
        metavar="ROLE",
        help="take a free NATS slot of ROLE first, held while the command runs",
    )
    run.add_argument(
        "--pod-slot",
        metavar="ROLE",
        help="Kubernetes: check that this pod's NATS password file exists first",
    )
    run.add_argument(
        "--secrets-dir", type=Path, default=slot_claim.SECRETS_DIR, help="where the slots are"
    )
    run.add_argument(
        "--lock-dir", type=Path, default=slot_claim.LOCK_DIR, help="the shared slot locks folder"
    )
    run.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=FILE",
        help="set NAME to the secret in FILE (repeatable)",
    )
    run.add_argument("argv", nargs=argparse.REMAINDER, help="-- then the command")


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="secrets_command", required=True, parser_class=type(p))
    compose = sub.add_parser("compose", help="write every secret into a folder, keeping any there")
    compose.add_argument("directory", type=Path, help="the secrets folder (made mode 0700)")
    compose.add_argument(
        "--host-id", default=None, help="the stack's host id (default: CRESCENT_HOST_ID)"
    )
    compose.add_argument(
        "--ca-dir",
        type=Path,
        default=None,
        help="where the deployment's CA (and its key) is kept (default: DIRECTORY/tls-ca)",
    )
    _add_slot_flags(compose)
    k8s = sub.add_parser("k8s", help="print fresh Secrets for deploy/k8s (kubectl create -f -)")
    k8s.add_argument("--namespace", default="crescent", help="the Secrets' namespace")
    only = k8s.add_mutually_exclusive_group()
    only.add_argument(
        "--nats-only",
        action="store_true",
        help="only NATS's configuration and passwords (to rotate them or change slot counts)",
    )
    only.add_argument(
        "--tls-only",
        action="store_true",
        help="only the certificates' Secrets (to renew them)",
    )
    k8s.add_argument(
        "--ca-dir",
        type=Path,
        default=None,
        help="keep the CA here (made on first use) and issue from it; default: a new CA "
        "each run, its key not kept",
    )
    _add_slot_flags(k8s)
    _add_exec(sub)


def _slots(args: argparse.Namespace) -> SlotSettings:
    given = {f"{r}_slots": getattr(args, f"{r}_slots") for r in SCALED}
    return SlotSettings(**{k: v for k, v in given.items() if v is not None})


def _plan(args: argparse.Namespace, kubernetes: bool) -> SecretPlan:
    if kubernetes:
        plan = secrets_init.k8s_plan(_slots(args), args.namespace)
    else:
        host = args.host_id if args.host_id is not None else CliSettings().host_id
        plan = secrets_init.compose_plan(_slots(args), host or "compose")
    if args.nats_users:
        # Role users instead of slots; the certificates stay those of the deployment.
        return SecretPlan(tuple(args.nats_users), certs=plan.certs, nats_tls=plan.nats_tls)
    return plan


def file_environment(assignments: Sequence[str], base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with each ``NAME=FILE`` of ``assignments`` set to the secret in FILE. Errors
    name the variable, never a value."""
    env = dict(base)
    for item in assignments:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--env {name or item!r}: expected NAME=FILE")
        env[name] = read_secret_file(Path(path), f"the file --env {name} names")
    return env


def _fail(message: str, status: int = 1) -> NoReturn:
    sys.stderr.write(f"crescent secrets exec: error: {message}\n")
    raise SystemExit(status)


def _exec(args: argparse.Namespace) -> NoReturn:
    command = list(args.argv[1:] if args.argv[:1] == ["--"] else args.argv)
    if not command:
        _fail("no command after --", 2)
    try:
        env = file_environment(args.env, child_environment())
        if args.claim:
            # The lock's descriptor stays open through the exec below: the service holds it.
            env |= slot_claim.claim(args.claim, args.secrets_dir, args.lock_dir).env()
        if args.pod_slot:
            slot_claim.check_pod_slot(args.pod_slot, env)
    except (ValueError, OSError, slot_claim.NoSlot) as exc:
        _fail(str(exc))
    os.execvpe(command[0], command, env)


def _print(line: str) -> None:
    print(line, flush=True)


def _notice(line: str) -> None:
    sys.stderr.write(line + "\n")


def run(args: argparse.Namespace) -> int:
    if args.secrets_command == "compose":
        return secrets_init.compose_main(args.directory, _plan(args, False), _print, args.ca_dir)
    if args.secrets_command == "k8s":
        status, notice = secrets_init.k8s_main(
            args.namespace,
            _plan(args, True),
            _print,
            nats_only=args.nats_only,
            tls_only=args.tls_only,
            ca_dir=args.ca_dir,
        )
        _notice(notice)
        return status
    _exec(args)
