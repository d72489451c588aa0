"""Whether the gateway's port is free before `crescent up` starts anything, and which process
holds it when it is not, as ``/proc`` tells (the sockets of ``/proc/net/tcp{,6}``, then the
process with one of them among its open files)."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

_LISTEN = "0A"
_CLOSE = "07"  # bound, not listening, not connected


class PortTaken(Exception):
    """A server of the stack could not listen where it was asked to; the message says why and
    who."""


def check_free(host: str, port: int, remedy: str = "pass another --port") -> None:
    """Raises ``PortTaken`` unless a server could listen on ``host:port`` now; its message ends
    with ``remedy`` where another port would do."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise PortTaken(f"cannot listen on {host}: {exc.strerror}") from None
    with socket.socket(family, kind, proto) as probe:
        # As the gateway's server (uvicorn) does: a closed connection's TIME_WAIT is no owner.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise PortTaken(_why(host, port, exc, remedy)) from None


def _why(host: str, port: int, exc: OSError, remedy: str) -> str:
    if exc.errno == errno.EACCES:
        return f"port {port} is below 1024 and needs privileges this user lacks; {remedy}"
    if exc.errno != errno.EADDRINUSE:
        return f"cannot listen on {host}:{port}: {exc.strerror}"
    pids = holders(port)
    if not pids:
        who = "a process /proc does not name (another user's, or a socket bound but not listening)"
    else:
        who = ", ".join(f"pid {pid} ({_command(pid)})" for pid in pids[:3])
    return f"port {port} is taken by {who}; stop it or {remedy}"


def holders(port: int) -> list[int]:
    """The pids with a socket bound to ``port`` (listening ones first), as far as ``/proc``
    shows this user."""
    inodes = _socket_inodes(port)
    if not inodes:
        return []
    found: dict[int, int] = {}  # pid -> rank of its socket (0: listening)
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            rank = _rank_of_sockets(proc, inodes)
            if rank is not None:
                found[int(proc.name)] = rank
    return sorted(found, key=lambda pid: (found[pid], pid))


def _socket_inodes(port: int) -> dict[str, int]:
    """Socket inode -> rank (0: listening, 1: only bound) of the TCP sockets on ``port``."""
    inodes: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or int(fields[1].rsplit(":", 1)[1], 16) != port:
                continue
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            bound = fields[3] == _LISTEN or (fields[3] == _CLOSE and remote_port == 0)
            if bound and fields[9] != "0":
                inodes[fields[9]] = 0 if fields[3] == _LISTEN else 1
    return inodes


def _rank_of_sockets(proc: Path, inodes: dict[str, int]) -> int | None:
    try:
        fds = os.listdir(proc / "fd")
    except OSError:
        return None
    ranks = []
    for fd in fds:
        try:
            target = os.readlink(proc / "fd" / fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            rank = inodes.get(target[8:-1])
            if rank is not None:
                ranks.append(rank)
    return min(ranks) if ranks else None


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"
