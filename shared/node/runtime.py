"""What every model node runs besides its role: the engine thread, the bus, heartbeats and the
operations port."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from shared.bus import Bus
from shared.cluster_messages import NodeStatus, StepSample
from shared.engine.async_engine import AsyncEngine
from shared.engine.engine import LLMEngine
from shared.engine.factory import load_engine
from shared.engine.types import RequestOutput
from shared.node.common import FetchBandwidth, heartbeat_loop, node_status
from shared.node.metrics import NodeMetrics
from shared.node.settings import NodeSettings
from shared.ops_http import OpsServer

if TYPE_CHECKING:
    from shared.node.catalogue import CatalogueSync

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
        self.fetch_bandwidth = FetchBandwidth()
        self.catalogue: CatalogueSync | None = None

    async def start(self, on_outputs: Callable[[list[RequestOutput]], Awaitable[None]]) -> None:
        s = self.settings
        loaded = await asyncio.to_thread(load_engine, s)
        self.engine: LLMEngine = loaded.engine
        self.bus = await Bus.connect(s.nats_url, f"crescent-{self.node_id}")
        self.async_engine = AsyncEngine(self.engine, on_outputs)
        self.async_engine.start()
        self.spawn(heartbeat_loop(self.bus, s.heartbeat_interval_s, self.status))
        if s.cachemeta_url:
            self._start_catalogue(s)
        if s.metrics_port is not None:
            registry = CollectorRegistry()
            registry.register(self.metrics)
            self.ops = OpsServer(s.metrics_host, s.metrics_port, self.healthy, registry)
            self.ops.start()

    def _start_catalogue(self, s: NodeSettings) -> None:
        # Imported here: a node without cachemeta never loads grpc.
        from shared.node.catalogue import CatalogueSync
        from shared.rpc.client import CacheMetaClient

        self.catalogue = CatalogueSync(
            CacheMetaClient(s.cachemeta_url),
            self.async_engine,
            self.node_id,
            self.role,
            self.engine.runner.cache.layout.block_bytes,
            sync_interval_s=s.catalogue_sync_s,
            heartbeat_interval_s=s.heartbeat_interval_s,
        )
        self.spawn(self.catalogue.run())

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        self.tasks.append(asyncio.create_task(work))

    def healthy(self) -> bool:
        return self.bus.connected and not self.async_engine.failed

    async def status(self) -> NodeStatus:
        engine = self.engine
        load, stats, timings = await self.async_engine.call_now(
            lambda: (engine.load(), dataclasses.replace(engine.stats), _drain(engine))
        )
        status = node_status(self.node_id, self.role, load, engine.config.block_size)
        status.pid = os.getpid()
        status.model_id = engine.model_id
        status.kv_dtype = engine.config.kv_dtype
        status.block_bytes = engine.runner.cache.layout.block_bytes
        status.max_num_batched_tokens = engine.config.max_num_batched_tokens
        status.step_samples = timings
        status.prompt_tokens_computed = stats.prompt_tokens_computed
        status.prompt_tokens_cached = stats.prompt_tokens_cached + stats.prompt_tokens_imported
        status.fetch_bandwidth = dict(self.fetch_bandwidth.by_source)
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
        if self.catalogue is not None:
            await self._leave_catalogue(self.catalogue)
        if self.ops is not None:
            self.ops.stop()

    async def _leave_catalogue(self, catalogue: CatalogueSync) -> None:
        """A clean stop withdraws the node's blocks at once instead of after the grace."""
        try:
            await asyncio.wait_for(catalogue.drop_all(), 2.0)
        except Exception as exc:
            log.warning("could not withdraw blocks from cachemeta: %s", exc)
        await catalogue.client.close()


def _drain(engine: LLMEngine) -> list[StepSample]:
    """The step timings since the last heartbeat, newest 64 at most (enough to fit on)."""
    timings = list(engine.step_timings)[-64:]
    engine.step_timings.clear()
    return [StepSample(t.num_seqs, t.num_tokens, t.num_context_tokens, t.seconds) for t in timings]
