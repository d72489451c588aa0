"""Bus adapter of the scheduler: heartbeats in, requests in, prefill tasks or errors out."""

from __future__ import annotations

import asyncio
import logging
import time

from services.scheduler.cluster import ClusterView, NodeLoad
from services.scheduler.lookup import PrefixLookup, hash_scope, prompt_block_hashes
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.policy import (
    Placement,
    PlacementRequest,
    Rejection,
    place,
    place_round_robin,
    record_placement,
)
from shared import subjects
from shared.bus import Bus
from shared.cluster_messages import NodeStatus, PrefillTask, PullPlan
from shared.kv.hashing import BlockHash
from shared.messages import GenerateRequest, TokenChunk
from shared.rpc.types import PrefixHolder

log = logging.getLogger(__name__)


class SchedulerHandlers:
    """Owns the cluster view and the requests being placed; every decision is ``policy.place``'s.

    Invariant: a placement is recorded in the view in the same event-loop step that computes it
    (nothing is awaited in between), so requests placed concurrently each see the ones before.
    """

    def __init__(
        self,
        bus: Bus,
        view: ClusterView,
        lookup: PrefixLookup,
        metrics: SchedulerMetrics,
        *,
        cache_secret: str,
        slo_s: float | None = None,
        round_robin: bool = False,
    ) -> None:
        self.bus = bus
        self.view = view
        self.lookup = lookup
        self.metrics = metrics
        self.cache_secret = cache_secret
        self.slo_s = slo_s
        self.round_robin = round_robin
        self._turn = 0
        self._in_flight: set[asyncio.Task[None]] = set()

    async def on_heartbeat(self, status: NodeStatus) -> None:
        if status.role not in ("prefill", "decode"):
            return
        now = time.monotonic()
        self.view.update(
            NodeLoad(
                node_id=status.node_id,
                role=status.role,
                queued_tokens=status.queued_tokens,
                running_seqs=status.running_seqs,
                free_blocks=status.free_blocks,
                total_blocks=status.total_blocks,
                block_size=status.block_size,
                last_seen=now,
                draining=status.draining,
                model_id=status.model_id,
                kv_dtype=status.kv_dtype,
                block_bytes=status.block_bytes,
                max_num_batched_tokens=status.max_num_batched_tokens,
                fetch_bandwidth=dict(status.fetch_bandwidth),
            )
        )
        self.view.timing.add(status.node_id, status.role, status.step_samples)
        self.view.forget_dead(now)

    async def submit(self, request: GenerateRequest) -> None:
        """Bus callback: places the request in the background, so a slow cachemeta lookup
        never holds up the requests behind it."""
        task = asyncio.create_task(self.on_request(request))
        self._in_flight.add(task)
        task.add_done_callback(self._done)

    async def drain(self, timeout_s: float) -> None:
        """Waits for requests being placed, up to ``timeout_s``."""
        if self._in_flight:
            await asyncio.wait(list(self._in_flight), timeout=timeout_s)

    async def on_request(self, request: GenerateRequest) -> None:
        ask = PlacementRequest(len(request.prompt_token_ids), request.sampling.max_tokens)
        if self.round_robin:
            hashes, holders = [], []
            self._turn += 1
            decision = place_round_robin(ask, self.view, self._turn, time.monotonic(), self.slo_s)
        else:
            hashes = self._block_hashes(request)
            holders = await self.lookup.match(hashes)
            decision = place(ask, self.view, holders, time.monotonic(), self.slo_s)
        if isinstance(decision, Rejection):
            await self._reject(request, decision)
            return
        record_placement(self.view, decision, ask)
        self.metrics.placed(decision, ask)
        self.lookup.touch(hashes[: _matched(holders)])
        await self.bus.publish(
            subjects.prefill_tasks(decision.prefill_node), _task(request, decision)
        )

    def _block_hashes(self, request: GenerateRequest) -> list[BlockHash]:
        scope = hash_scope(self.view.live("prefill", time.monotonic()))
        if scope is None:
            if self.lookup.index is not None:
                self.metrics.fell_back("no_hash_scope")
            return []
        return prompt_block_hashes(
            request.prompt_token_ids, scope, self.cache_secret, request.tenant, request.cache_salt
        )

    async def _reject(self, request: GenerateRequest, rejection: Rejection) -> None:
        self.metrics.rejected(rejection)
        log.warning("rejected %s: %s", request.request_id, rejection.reason)
        error = TokenChunk(
            request_id=request.request_id,
            index=0,
            token_ids=[],
            error=rejection.reason,
            error_code=rejection.status,
            retry_after_s=rejection.retry_after_s,
        )
        await self.bus.publish(subjects.tokens(request.request_id), error)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("placing a request failed", exc_info=task.exception())


def _matched(holders: list[PrefixHolder]) -> int:
    return max((h.num_blocks for h in holders), default=0)


def _task(request: GenerateRequest, placement: Placement) -> PrefillTask:
    return PrefillTask(
        request=request,
        decode_node=placement.decode_node,
        pulls=[
            PullPlan(node_id=p.node_id, first_block=p.first_block, num_blocks=p.num_blocks)
            for p in placement.pulls
        ],
        predicted_ttft_s=placement.predicted_ttft_s,
    )
