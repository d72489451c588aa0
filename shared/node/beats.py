"""What a node says of itself: its heartbeat (``NodeStatus``), the extra beat it sends on a
change, and its health for ``/healthz``."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

from shared import subjects
from shared.cluster_messages import NodeStatus
from shared.node.direct import DirectReader
from shared.node.metrics import NodeMetrics
from shared.node.puller import BlockPuller
from shared.node.serving import NodeServing
from shared.node.status import fill_status
from shared.transfer.base import TransferServer


@dataclass(slots=True)
class NodeBeats:
    """Owns nothing: reads the node's parts into a status. Invariant: ``bare`` never waits
    on the engine, so a stuck node still says, in time, that it is unhealthy."""

    serving: NodeServing
    role_name: str
    host_id: str
    fingerprint: str
    puller: BlockPuller
    server: TransferServer
    direct: DirectReader | None
    metrics: NodeMetrics

    def healthy(self) -> bool:
        """For /healthz: the bus is up and the engine steps."""
        return self.serving.bus.connected and self.engine_healthy()

    def engine_healthy(self) -> bool:
        """What heartbeats say: one that arrives proves the bus, and one made while the bus
        was down, sent once it is back, would call a working node unhealthy."""
        return not self.serving.host.stuck()

    async def status(self) -> NodeStatus:
        host = self.serving.host
        snap = await host.load_snapshot()
        status = self.bare()
        fill_status(status, snap, host, self.puller, self.server, self.direct)
        self.metrics.waiting_seqs = snap.load.waiting_seqs
        self.metrics.cached_blocks = snap.cached_blocks
        self.metrics.pool_evictions = snap.pool_evictions
        if self.serving.role is not None:
            self.serving.role.describe(status)
        self.metrics.update(status, snap.stats)
        return status

    def bare(self) -> NodeStatus:
        """What a heartbeat says without asking the engine."""
        serving = self.serving
        return NodeStatus(
            node_id=serving.node_id,
            role=self.role_name,
            epoch=serving.epoch,
            healthy=self.engine_healthy(),
            draining=serving.draining,
            transfer_kind=serving.settings.transfer,
            transfer_address=serving.transfer_address,
            block_size=serving.block_size,
            pid=os.getpid(),
            secret_fingerprint=self.fingerprint,
            host_id=self.host_id,
        )

    async def beat_now(self) -> None:
        """An extra heartbeat, so peers learn of a change (draining) without waiting."""
        try:
            status = await asyncio.wait_for(self.status(), 1.0)
        except TimeoutError:
            status = self.bare()
        status.ts = time.time()
        subject = subjects.heartbeats(self.role_name, self.serving.node_id)
        await self.serving.bus.publish(subject, status)
