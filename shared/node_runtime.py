"""What every model node runs besides its role: the engine thread, the bus, heartbeats and the
operations port."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from prometheus_client import CollectorRegistry

from shared.bus import Bus
from shared.engine.async_engine import AsyncEngine
from shared.engine.engine import LLMEngine, RequestOutput
from shared.engine.factory import load_engine
from shared.messages import NodeStatus
from shared.node import NodeSettings, heartbeat_loop, node_status
from shared.node_metrics import NodeMetrics
from shared.ops_http import OpsServer

log = logging.getLogger(__name__)


class NodeRuntime:
    """Owns the engine (on its own thread), the bus connection, the heartbeat and the ops
    server of one prefill or decode node, and the background tasks it runs for its role.

    Invariant: after ``stop`` nothing of it runs: tasks cancelled, bus drained, engine thread
    joined, ops port closed.
    """

    def __init__(self, settings: NodeSettings, role: str) -> None:
        self.settings = settings
        self.role = role
        self.node_id = settings.resolved_node_id(role)
        self.tasks: list[asyncio.Task[None]] = []
        self.describe: Callable[[NodeStatus], None] = lambda status: None
        self.metrics = NodeMetrics(self.node_id, role)
        self.ops: OpsServer | None = None

    async def start(self, on_outputs: Callable[[list[RequestOutput]], Awaitable[None]]) -> None:
        s = self.settings
        loaded = await asyncio.to_thread(load_engine, s)
        self.engine: LLMEngine = loaded.engine
        self.bus = await Bus.connect(s.nats_url, f"crescent-{self.node_id}")
        self.async_engine = AsyncEngine(self.engine, on_outputs)
        self.async_engine.start()
        self.spawn(heartbeat_loop(self.bus, s.heartbeat_interval_s, self.status))
        if s.metrics_port is not None:
            registry = CollectorRegistry()
            registry.register(self.metrics)
            self.ops = OpsServer(s.metrics_host, s.metrics_port, self.healthy, registry)
            self.ops.start()

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        self.tasks.append(asyncio.create_task(work))

    def healthy(self) -> bool:
        return self.bus.connected and not self.async_engine.failed

    async def status(self) -> NodeStatus:
        engine = self.engine
        load, stats = await self.async_engine.call(
            lambda: (engine.load(), dataclasses.replace(engine.stats))
        )
        status = node_status(self.node_id, self.role, load, engine.config.block_size)
        status.pid = os.getpid()
        self.describe(status)
        self.metrics.update(status, stats)
        return status

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.bus.close()
        await self.async_engine.stop()
        if self.ops is not None:
            self.ops.stop()
