"""tierd in ``crescent up``: the stack is one host, so one tierd keeps the blocks of all its
nodes, in ``<data dir>/nvme`` unless ``CRESCENT_NVME_DIR`` says otherwise, and moves the coldest
to S3 where the stack has one (``--with-s3`` or ``CRESCENT_S3_ENDPOINT``)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from crescent.processes import Child, spawn
from crescent.secret_files import private_dir
from crescent.up_roles import role_environment
from shared import subjects

#: Settings of another S3 server, which the stack's own (``--with-s3``) replaces.
S3_SETTINGS = (
    "CRESCENT_S3_ENDPOINT",
    "CRESCENT_S3_BUCKET",
    "CRESCENT_S3_PREFIX",
    "CRESCENT_S3_ACCESS_KEY",
    "CRESCENT_S3_ACCESS_KEY_FILE",
    "CRESCENT_S3_SECRET_KEY",
    "CRESCENT_S3_SECRET_KEY_FILE",
)


def apply_host_defaults(env: dict[str, str], data_dir: Path) -> None:
    """One host id for every child (a node finds its tierd by it) and the NVMe folder tierd
    writes and the nodes read; given values win."""
    env["CRESCENT_HOST_ID"] = subjects.host_id(env.get("CRESCENT_HOST_ID", ""))
    if not env.get("CRESCENT_NVME_DIR"):
        # The block files hold what tenants' prompts computed: only this user may read them.
        env["CRESCENT_NVME_DIR"] = str(private_dir(data_dir / "nvme"))


def drop_s3_settings(env: dict[str, str]) -> None:
    """Forgets an inherited S3 server's settings, for a stack that runs its own."""
    for name in S3_SETTINGS:
        env.pop(name, None)


def node_id(env: dict[str, str]) -> str:
    """The id the host's tierd runs under (the one its heartbeats carry)."""
    return f"tierd-{env['CRESCENT_HOST_ID']}"


def start_tierd(
    env: dict[str, str], roles: Mapping[str, Mapping[str, str]], log_dir: Path, metrics_port: int
) -> Child:
    """The host's tierd as the child ``tierd``, with its NATS user, the cachemeta token and
    the stack's S3 server (what ``roles`` gives tierd and its node id), its metrics on
    ``metrics_port``."""
    argv = [sys.executable, "-m", "services.tierd"]
    own = {"CRESCENT_METRICS_PORT": str(metrics_port)}
    return spawn("tierd", argv, role_environment(env, roles, "tierd", node_id(env), own), log_dir)
