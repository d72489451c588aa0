"""Every service's heartbeat: its NodeStatus on ``heartbeats.<role>.<id>``, every interval."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from shared import subjects
from shared.bus import Bus
from shared.cluster_messages import NodeStatus

log = logging.getLogger(__name__)


async def heartbeat_loop(
    bus: Bus,
    interval_s: float,
    status: Callable[[], Awaitable[NodeStatus]],
    fallback: Callable[[], NodeStatus],
) -> None:
    """Publishes ``status()`` every interval until cancelled. A status that takes longer than
    an interval (an engine wedged under its lock, say) is replaced by ``fallback()``, which
    must not wait on anything: a stuck node still says, in time, that it is unhealthy. A
    failed beat is logged and the next one tried, so a bus hiccup never silences a node; none
    is sent while the bus is down."""
    while True:
        started = time.monotonic()
        try:
            try:
                # Not ``wait_for``: on Python 3.11 it can swallow a cancel that comes as the
                # status completes, and the loop then never stops (seen in the tests).
                async with asyncio.timeout(interval_s):
                    beat = await status()
            except TimeoutError:
                beat = fallback()
                beat.healthy = False
            beat.ts = time.time()
            # A beat published while the bus is down waits in the client's buffer and
            # arrives after reconnection saying stale things; the next one is made fresh.
            if bus.connected:
                await bus.publish(subjects.heartbeats(beat.role, beat.node_id), beat)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("heartbeat failed")
        await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - started)))
