"""Every service's heartbeat: its NodeStatus on ``heartbeats.<role>.<id>``, every interval.

A service registers ``Heartbeat.beat`` as a periodic task (``Lifecycle.every``) whose interval
is the heartbeat interval."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from shared import subjects
from shared.bus import Bus
from shared.cluster_messages import NodeStatus

log = logging.getLogger(__name__)


class Heartbeat:
    """Owns how one service's beat is made and sent.

    Invariant: a beat is ready within ``interval_s``: a status that takes longer (an engine
    wedged under its lock, say) is replaced by ``fallback()``, which must not wait on anything,
    so a stuck node still says, in time, that it is unhealthy. None is sent while the bus is
    down. A beat that fails raises to its caller, which logs it and tries the next one, so a bus
    hiccup never silences a node.
    """

    def __init__(
        self,
        bus: Bus,
        interval_s: float,
        status: Callable[[], Awaitable[NodeStatus]],
        fallback: Callable[[], NodeStatus],
    ) -> None:
        self.bus = bus
        self.interval_s = interval_s
        self.status = status
        self.fallback = fallback

    async def beat(self) -> None:
        """Makes and publishes one beat."""
        try:
            # Not ``wait_for``: on Python 3.11 it can swallow a cancel that comes as the
            # status completes, and the task then never stops (seen in the tests).
            async with asyncio.timeout(self.interval_s):
                beat = await self.status()
        except TimeoutError:
            beat = self.fallback()
            beat.healthy = False
        beat.ts = time.time()
        # A beat published while the bus is down waits in the client's buffer and arrives
        # after reconnection saying stale things; the next one is made fresh.
        if self.bus.connected:
            await self.bus.publish(subjects.heartbeats(beat.role, beat.node_id), beat)
