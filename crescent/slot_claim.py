"""A compose replica takes a free slot of its role (``crescent secrets exec --claim ROLE``).

Each slot has a lock file in a folder every replica of the stack mounts writable. A replica
holds an exclusive ``flock`` on its slot's file through an open descriptor that survives the
``exec`` into the service, so the slot is held exactly as long as the service process lives:
the kernel drops the lock when it exits, however it exits (SIGKILL, OOM, a crash), and the
next replica to start may take the slot. Nothing has to be cleaned up after a dead replica.
"""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from crescent.secret_files import PRIVATE_FILE
from crescent.secrets_init import nats_password_key, role_secret_name
from crescent.slots import SCALED, read_slots, setting_name
from shared.secrets import read_secret_file

#: Where docker-compose.yml mounts the secrets volume and the slot locks volume.
SECRETS_DIR = Path("/var/lib/crescent/secrets")
LOCK_DIR = Path("/var/lib/crescent/slots")
#: The variable each role reads its id from (``shared.nats_auth.own_id`` would default it to
#: the NATS user anyway; setting it too makes the choice visible in the environment).
_ID_VARIABLE = {"gateway": "CRESCENT_GATEWAY_ID", "scheduler": "CRESCENT_SCHEDULER_ID"}


class NoSlot(Exception):
    """A replica has no NATS identity to run as: every slot of its role is held (compose), or
    its pod's name is not among its role's slots (Kubernetes)."""


@dataclass(frozen=True, slots=True)
class Claim:
    """A slot this process holds. Invariant: ``lock_fd`` is open, inheritable across exec and
    holds the exclusive lock of ``node_id``'s lock file."""

    role: str
    node_id: str
    password_file: Path
    lock_fd: int

    def env(self) -> dict[str, str]:
        """The variables that make the service run as this slot's node."""
        ids = {"CRESCENT_NODE_ID": self.node_id}
        if self.role in _ID_VARIABLE:
            ids[_ID_VARIABLE[self.role]] = self.node_id
        return ids | {
            "CRESCENT_NATS_USER": self.node_id,
            "CRESCENT_NATS_PASSWORD_FILE": str(self.password_file),
        }


def _try_lock(path: Path) -> int | None:
    """An open descriptor holding ``path``'s exclusive lock, or None if another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _mark_holder(fd: int) -> None:
    # Only for an operator who wonders which container holds a slot: the lock is the truth.
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{socket.gethostname()} pid {os.getpid()}\n".encode(), 0)


def claim(role: str, secrets_dir: Path = SECRETS_DIR, lock_dir: Path = LOCK_DIR) -> Claim:
    """The first free slot of ``role``, locked by this process until it exits."""
    node_ids = read_slots(secrets_dir, role)
    lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    for node_id in node_ids:
        password_file = secrets_dir / nats_password_key(node_id)
        fd = _try_lock(lock_dir / f"{node_id}.lock")
        if fd is None:
            continue
        try:
            read_secret_file(password_file, f"the password file of slot {node_id}")
            _mark_holder(fd)
        except BaseException:
            os.close(fd)
            raise
        os.set_inheritable(fd, True)
        return Claim(role, node_id, password_file, fd)
    raise NoSlot(_taken_message(role, len(node_ids)))


def _taken_message(role: str, count: int) -> str:
    if role in SCALED:
        remedy = (
            f"raise {setting_name(role)} (now {count}) and run secrets-init again "
            "(`docker compose up` does), or run fewer replicas"
        )
    elif role == "tierd":
        remedy = "a stack runs one tierd per host"
    else:
        remedy = f"a stack runs one {role}"
    return f"all {count} {role} slot(s) are held by running replicas: {remedy}"


def _secret_keys(folder: Path) -> list[str]:
    """The keys of a Secret mounted at ``folder``; its own bookkeeping entries start with "."."""
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def check_pod_slot(role: str, env: Mapping[str, str]) -> None:
    """Kubernetes: the password file a pod's name selects (``CRESCENT_NATS_PASSWORD_FILE``, in
    the mounted Secret of its role's slots) exists; else says how many slots there are and how
    to make more, rather than leave the service to fail on a missing file."""
    path = Path(env.get("CRESCENT_NATS_PASSWORD_FILE", ""))
    if path.name and path.is_file():
        return
    held = _secret_keys(path.parent)
    raise NoSlot(
        f"pod {path.name or '?'} has no NATS identity: the Secret {role_secret_name(role)} "
        f"holds {len(held)} slot(s) ({', '.join(held) or 'none'}); make more with "
        f"`crescent secrets k8s --nats-only --{role}-slots N | kubectl -n crescent replace -f -`"
        ", then restart NATS and every Crescent pod"
    )
