"""Network namespaces joined by veth pairs: hosts made on one machine, whose links can be cut.

A namespace has its own interfaces, addresses and routes, so a service started in it with
``ip netns exec`` reaches the others only over the veth pair that joins it to the host (or to
a bridge on the host): a link that can be taken down, which no process hears about. Used by
``bench/partition.py`` (one node cut off) and ``tests/chaos/test_multihost.py`` (several hosts).
Needs root (``ip netns``, veth, bridges).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Sequence


def ip(*args: str) -> None:
    """Runs ``ip`` with ``args``; ``CalledProcessError`` when it fails."""
    subprocess.run(["ip", *args], check=True, capture_output=True)


def _quietly(*args: str) -> None:
    with contextlib.suppress(subprocess.CalledProcessError):
        ip(*args)


def supported(probe: str) -> str | None:
    """Why namespaces cannot be made here, or None; ``probe`` names the namespace tried (each
    user of this module its own, so two never race on one name)."""
    if os.geteuid() != 0:
        return "needs root for ip netns"
    try:
        ip("netns", "add", probe)
        ip("netns", "del", probe)
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"ip netns does not work here: {exc}"
    return None


@contextlib.contextmanager
def namespace(name: str) -> Iterator[None]:
    """A fresh namespace ``name`` with its loopback up, deleted afterwards (with the veth ends
    in it, and so their pairs)."""
    _quietly("netns", "del", name)  # what a run killed before its cleanup left behind
    ip("netns", "add", name)
    try:
        ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
        yield
    finally:
        ip("netns", "del", name)


def veth(host_if: str, name: str, inner_if: str, inner_cidr: str, *, outer: str) -> None:
    """A veth pair from the host (``host_if``) into namespace ``name`` (``inner_if``, with the
    address ``inner_cidr``), both ends up. ``outer`` is the host end's address (``10.0.0.1/24``)
    or, prefixed ``bridge:``, the bridge it joins."""
    _quietly("link", "del", host_if)
    ip("link", "add", host_if, "type", "veth", "peer", "name", inner_if)
    ip("link", "set", inner_if, "netns", name)
    if outer.startswith("bridge:"):
        ip("link", "set", host_if, "master", outer.removeprefix("bridge:"))
    else:
        ip("addr", "add", outer, "dev", host_if)
    ip("link", "set", host_if, "up")
    ip("netns", "exec", name, "ip", "addr", "add", inner_cidr, "dev", inner_if)
    ip("netns", "exec", name, "ip", "link", "set", inner_if, "up")


def remove_link(host_if: str) -> None:
    """Deletes the host end ``host_if`` (and so its pair) if it is there."""
    _quietly("link", "del", host_if)


@contextlib.contextmanager
def bridge(name: str, cidr: str) -> Iterator[None]:
    """A bridge on the host with the address ``cidr``: the switch the namespaces' links join,
    so they reach each other and the host without any routing."""
    _quietly("link", "del", name)
    ip("link", "add", name, "type", "bridge")
    try:
        ip("addr", "add", cidr, "dev", name)
        ip("link", "set", name, "up")
        yield
    finally:
        _quietly("link", "del", name)


def set_link(host_if: str, up: bool) -> None:
    """Takes the host end of a link down (nothing passes, nobody is told) or up again."""
    ip("link", "set", host_if, "up" if up else "down")


def inside(name: str, argv: Sequence[str]) -> list[str]:
    """``argv`` run in namespace ``name``."""
    return ["ip", "netns", "exec", name, *argv]


def link_bytes(host_if: str, direction: str) -> int:
    """Bytes the host end ``host_if`` has sent (``tx``) or received (``rx``) so far."""
    with open(f"/sys/class/net/{host_if}/statistics/{direction}_bytes") as counter:
        return int(counter.read())
