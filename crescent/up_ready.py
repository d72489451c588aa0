"""The last waits of `crescent up`'s start: every node's first heartbeat, then the gateway's
``/health`` and kvindex's ``/healthz``. Each gives up at a stop asked for (``Stopped``), at a
child that exits, or at its deadline (``NotReady``)."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from typing import Any

from crescent.processes import Child
from crescent.up_stop import StopSignals

READY_TIMEOUT_S = 600.0
GATEWAY_TIMEOUT_S = 60.0


class NotReady(Exception):
    """The stack did not come up: a child exited or a wait ran out of time."""


def wait_nodes(
    nats_url: str,
    nats_auth: dict[str, Any],
    expected: set[str],
    children: list[Child],
    signals: StopSignals,
) -> None:
    """Returns once each node in ``expected`` has sent a heartbeat."""
    seen = asyncio.run(_await_heartbeats(nats_url, nats_auth, expected, children, signals))
    signals.check()
    if seen != expected:
        raise NotReady(f"nodes never reported ready: {sorted(expected - seen)}")


def wait_gateway(base_url: str, children: list[Child], signals: StopSignals) -> None:
    """Returns once the gateway's ``/health`` answers 200."""
    wait_healthy(f"{base_url}/health", "the gateway", children, signals)


def wait_healthy(
    url: str,
    what: str,
    children: list[Child],
    signals: StopSignals,
    timeout_s: float = GATEWAY_TIMEOUT_S,
) -> None:
    """Returns once ``url`` (a health endpoint of ``what``) answers 200."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not signals.requested:
        check_alive(children)
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    signals.check()
    raise NotReady(f"{what} did not become healthy")


async def _await_heartbeats(
    nats_url: str,
    nats_auth: dict[str, Any],
    expected: set[str],
    children: list[Child],
    signals: StopSignals,
) -> set[str]:
    from shared import subjects
    from shared.bus import NatsBus
    from shared.cluster_messages import NodeStatus

    seen: set[str] = set()
    bus = await NatsBus.connect(nats_url, "crescent-up", **nats_auth)

    async def on_beat(status: NodeStatus) -> None:
        seen.add(status.node_id)

    await bus.subscribe(subjects.HEARTBEATS_ALL, NodeStatus, on_beat)
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while not expected <= seen and time.monotonic() < deadline and not signals.requested:
            check_alive(children)
            await asyncio.sleep(0.2)
    finally:
        await bus.close()
    return seen & expected


def check_alive(children: list[Child]) -> None:
    for child in children:
        if not child.running:
            raise NotReady(
                f"{child.name} exited with status {child.proc.returncode}; see {child.log_path}"
            )
