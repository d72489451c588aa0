"""Bus adapter of the scheduler: heartbeats in, requests in, prefill tasks or errors out."""

from __future__ import annotations

import logging
import time

from services.scheduler.policy import (
    ClusterView,
    NodeLoad,
    Placement,
    PlacementRequest,
    place,
    record_placement,
)
from shared import subjects
from shared.bus import Bus
from shared.messages import GenerateRequest, NodeStatus, PrefillTask, TokenChunk

log = logging.getLogger(__name__)


class SchedulerHandlers:
    """Owns the cluster view; every placement decision is ``policy.place``'s."""

    def __init__(self, bus: Bus, view: ClusterView) -> None:
        self.bus = bus
        self.view = view
        self.placed = 0
        self.rejected = 0

    async def on_heartbeat(self, status: NodeStatus) -> None:
        if status.role not in ("prefill", "decode"):
            return
        self.view.update(
            NodeLoad(
                node_id=status.node_id,
                role=status.role,
                queued_tokens=status.queued_tokens,
                running_seqs=status.running_seqs,
                free_blocks=status.free_blocks,
                total_blocks=status.total_blocks,
                block_size=status.block_size,
                last_seen=time.monotonic(),
                draining=status.draining,
            )
        )

    async def on_request(self, request: GenerateRequest) -> None:
        ask = PlacementRequest(len(request.prompt_token_ids), request.sampling.max_tokens)
        decision = place(ask, self.view, time.monotonic())
        if isinstance(decision, Placement):
            record_placement(self.view, decision, ask)
            self.placed += 1
            task = PrefillTask(request=request, decode_node=decision.decode_node)
            await self.bus.publish(subjects.prefill_tasks(decision.prefill_node), task)
            return
        self.rejected += 1
        log.warning("rejected %s: %s", request.request_id, decision.reason)
        error = TokenChunk(
            request_id=request.request_id,
            index=0,
            token_ids=[],
            error=decision.reason,
            error_code=decision.status,
        )
        await self.bus.publish(subjects.tokens(request.request_id), error)
