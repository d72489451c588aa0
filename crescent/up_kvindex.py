"""kvindex in ``crescent up``: the stack's one KV index, which folds the KV events its nodes and
tierd publish and answers prefix queries (``POST /v1/kv/query``) over HTTP.

Its port is ``CRESCENT_KVINDEX_PORT`` when set (0: any free port), refused before anything
starts when taken. Unset, it is 8091 when free, else a free port: a second stack on the same
machine must not fail for want of a port that only tools query. kvindex itself falls back
(two stacks starting at once may both see 8091 free) and writes the port it took to
``<data dir>/kvindex.port``; where it landed is in ``stack.json`` and in the lines that say
the stack serves. Callers present the catalogue's token, the stack's
``secrets/cachemeta.token`` unless the environment names another.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from crescent.processes import Child, spawn
from crescent.up_port import PortTaken, check_free
from crescent.up_roles import role_environment

NAME = "kvindex"
DEFAULT_PORT = 8091
#: Where kvindex writes the port it listens on, in the stack's data dir.
PORT_FILE = "kvindex.port"
_REMEDY = "set CRESCENT_KVINDEX_PORT to another port (0: any free one)"


@dataclass(frozen=True, slots=True)
class KvIndexPlace:
    """Where the stack's kvindex answers queries. Invariant: ``port`` is a real port, not 0;
    with ``fallback`` kvindex may take another when that one is taken, and ``landed`` says
    which."""

    host: str
    port: int
    fallback: bool = False

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def env(self) -> dict[str, str]:
        own = {"CRESCENT_KVINDEX_HOST": self.host, "CRESCENT_KVINDEX_PORT": str(self.port)}
        return own | ({"CRESCENT_KVINDEX_PORT_FALLBACK": "true"} if self.fallback else {})

    def where(self, ops: int) -> dict[str, str]:
        """What ``stack.json`` says of kvindex: its queries' base URL and its ``/metrics``
        (on the ops port ``ops``)."""
        return {"kvindex": self.url, "kvindex_metrics": f"http://127.0.0.1:{ops}/metrics"}


def place(
    env: Mapping[str, str], free_port: Callable[[], int], default: int = DEFAULT_PORT
) -> KvIndexPlace:
    """Where kvindex will listen, from the stack's environment ``env``; ``free_port`` gives a
    port no other child of the stack was given. ``PortTaken`` when the configured one is."""
    host = env.get("CRESCENT_KVINDEX_HOST") or "127.0.0.1"
    configured = env.get("CRESCENT_KVINDEX_PORT", "").strip()
    if not configured:
        try:
            check_free(host, default, _REMEDY)
        except PortTaken:
            return KvIndexPlace(host, free_port())
        return KvIndexPlace(host, default, fallback=True)
    if not configured.isdigit() or int(configured) > 65535:
        raise PortTaken(f"CRESCENT_KVINDEX_PORT={configured!r} is not a port")
    if int(configured) == 0:
        return KvIndexPlace(host, free_port())
    check_free(host, int(configured), _REMEDY)
    return KvIndexPlace(host, int(configured))


def start(
    env: dict[str, str],
    roles: Mapping[str, Mapping[str, str]],
    data_dir: Path,
    where: KvIndexPlace,
    ops: int,
) -> Child:
    """kvindex as the child ``kvindex``, with its NATS user and the catalogue's token (what
    ``roles`` gives it), listening at ``where``, its ``/healthz`` and ``/metrics`` on ``ops``,
    logging under ``data_dir``."""
    argv = [sys.executable, "-m", "services.kvindex"]
    port_file = data_dir / PORT_FILE
    port_file.unlink(missing_ok=True)  # a previous run's must not be read as this one's
    own = where.env() | {
        "CRESCENT_METRICS_PORT": str(ops),
        "CRESCENT_KVINDEX_PORT_FILE": str(port_file),
    }
    return spawn(NAME, argv, role_environment(env, roles, NAME, NAME, own), data_dir / "logs")


def landed(where: KvIndexPlace, data_dir: Path) -> KvIndexPlace:
    """Where kvindex listens once healthy: the port it wrote, which differs from ``where``'s
    only when it fell back."""
    try:
        port = int((data_dir / PORT_FILE).read_text())
    except (OSError, ValueError):
        return where
    return KvIndexPlace(where.host, port)


def summary(where: KvIndexPlace, child_env: Mapping[str, str]) -> str:
    """Where kvindex answers and which token it asks for (never the token itself), from the
    environment it was started with."""
    query = f"{where.url}/v1/kv/query"
    token_file = child_env.get("CRESCENT_CACHEMETA_TOKEN_FILE")
    if token_file:
        return f"{query} (Authorization: Bearer <the token in {token_file}>)"
    if child_env.get("CRESCENT_CACHEMETA_TOKEN"):
        return f"{query} (Authorization: Bearer <CRESCENT_CACHEMETA_TOKEN>)"
    return f"{query} (no token: development mode)"
