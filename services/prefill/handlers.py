"""Bus adapter of a prefill node: tasks in (acknowledged), first tokens out, KV handed to the
first decode node that acknowledges it."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque

from shared import phases, subjects
from shared.background import Background
from shared.bus import BusRequestError, NoResponders
from shared.cluster_messages import KVHandoff, NodeStatus, PrefillTask, TaskAck
from shared.engine.sequence import FinishReason
from shared.engine.types import RequestOutput
from shared.errors import InvalidRequestError
from shared.messages import AbortRequest, TokenChunk
from shared.node.chunks import output_chunk, request_salt
from shared.node.ledger import Lease, Stage
from shared.node.prefix import FetchedPrefix, PrefixFetcher
from shared.node.runtime import NodeRuntime
from shared.sampling_params import SamplingParams
from shared.stream_auth import seal_abort

log = logging.getLogger(__name__)
#: While draining, tasks still prefilling after this long are handed back to their gateway.
DRAIN_FINISH_S = 5.0


class PrefillRole:
    """Owns the tasks this node accepted, from their acknowledgement until their first token
    is out and their KV is leased to a decode node (or they failed).

    Invariant: an accepted task ends in exactly one of: a finished request (first token was
    also the last), a lease taken by a decode node (announced to the gateway by an owner
    chunk), an error chunk, an abort, or (while draining) a migrate chunk.
    """

    def __init__(self, node: NodeRuntime, fetcher: PrefixFetcher) -> None:
        self.node = node
        self.fetcher = fetcher
        self.tasks: dict[str, PrefillTask] = {}
        self.arrived: dict[str, float] = {}
        self.fetched: dict[str, FetchedPrefix] = {}  # what each task pulled, until its token
        # (predicted, actual) seconds from arrival to first token, for the scheduler.
        self.ttft_samples: deque[tuple[float, float]] = deque(maxlen=64)
        self._work = Background()

    async def on_task(self, task: PrefillTask) -> TaskAck:
        node, req = self.node, task.request
        rid = req.request_id
        params = node.screen(req, len(self.tasks), "prefill queue")
        if isinstance(params, TaskAck):
            return params
        node.ledger.open(
            rid, req.gateway_id, req.deadline_ts, req.sampling.output_offset, req.stream_key
        )
        self.tasks[rid] = task
        self.arrived[rid] = time.monotonic()
        self._work.spawn(self._start(task, params))
        return self.node.ack(True)

    async def _start(self, task: PrefillTask, params: SamplingParams) -> None:
        """Pulls the planned prefix and admits the request for its first token, holding its
        blocks for the hand-off (``PrefixFetcher.admit``)."""
        req, node = task.request, self.node
        rid = req.request_id
        salt = request_salt(node.settings.cache_secret, req)

        def keep(fetched: FetchedPrefix) -> bool:
            if rid not in self.tasks:  # aborted while its blocks were pulled
                return False
            self.fetched[rid] = fetched
            return True

        first_only = dataclasses.replace(params, max_tokens=1)
        prompt = list(req.prompt_token_ids)
        try:
            admitted = await self.fetcher.admit(
                rid,
                prompt,
                first_only,
                salt,
                task.pulls if params.cache_read else [],
                keep,
                hold_blocks=True,
            )
        except InvalidRequestError as exc:
            await self.on_abort(rid)
            await node.fail(rid, str(exc), 400)
            return
        holding = node.ledger.active(rid) if admitted else None
        if holding is not None:
            holding.stage = Stage.RUNNING

    async def on_outputs(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            task = self.tasks.pop(out.request_id, None)
            arrived = self.arrived.pop(out.request_id, None)
            fetched = self.fetched.pop(out.request_id, None) or FetchedPrefix()
            if task is None:
                continue
            if out.error is not None:
                await self.node.fail(out.request_id, out.error, 500)
                continue
            if arrived is not None and task.predicted_ttft_s > 0:
                self.ttft_samples.append((task.predicted_ttft_s, time.monotonic() - arrived))
            await self._first_token(task, out, fetched, arrived)

    async def _first_token(
        self, task: PrefillTask, out: RequestOutput, fetched: FetchedPrefix, arrived: float | None
    ) -> None:
        node, req = self.node, task.request
        rid = req.request_id
        output_at = time.monotonic()
        done = out.finish_reason is FinishReason.STOP or req.sampling.max_tokens == 1
        chunk = output_chunk(out, req.sampling.output_offset, out.num_cached_tokens)
        if arrived is not None and out.admitted_at >= arrived:
            chunk.phases = phases.prefill_phases(
                arrived, fetched.seconds, out.admitted_at, time.monotonic()
            )
        block_size = node.engine.config.block_size
        chunk.cached_by_tier = fetched.tokens_by_tier(out.num_cached_tokens, block_size)
        node.metrics.served_from_cache(fetched.tokens_by_source(out.num_cached_tokens, block_size))
        chunk.finish_reason = (chunk.finish_reason or FinishReason.LENGTH.value) if done else None
        node.ledger.record(rid, chunk.token_ids, chunk.logprobs)
        holding = node.ledger.active(rid)
        if holding is not None:
            holding.num_cached_tokens = out.num_cached_tokens
            holding.cached_by_tier = chunk.cached_by_tier
        await node.send(chunk)
        if done:
            node.ledger.finish(rid, time.monotonic(), reason=chunk.finish_reason)
            await node.host.release_held(rid)
            return
        block_ids = await node.host.held_block_ids(rid)
        if block_ids is None or holding is None or not holding.active:
            return  # aborted meanwhile; the abort freed the blocks
        lease = node.ledger.grant(rid, block_ids, time.monotonic())
        holding.stage = Stage.HANDING_OFF
        checksums = await asyncio.to_thread(self._checksums, block_ids)
        handoff = KVHandoff(
            request=req,
            first_token=out.new_token_ids[0],
            prefill_node=node.node_id,
            transfer_kind=node.settings.transfer,
            transfer_address=node.server.address,
            lease_id=lease.token,
            block_ids=block_ids,
            block_checksums=checksums,
            num_cached_tokens=out.num_cached_tokens,
            cached_by_tier=chunk.cached_by_tier,
            first_logprob=chunk.logprobs[0] if chunk.logprobs else None,
            prepared_s=time.monotonic() - output_at,
        )
        await self._hand_off(task, handoff, lease)

    async def _hand_off(self, task: PrefillTask, handoff: KVHandoff, lease: Lease) -> None:
        """Offers the KV to each ranked decode node in turn until one acknowledges it."""
        node, rid = self.node, task.request.request_id
        for decode_node in task.decode_nodes:
            if node.ledger.active(rid) is None:
                return  # aborted while we waited for an answer
            try:
                ack = await node.bus.request(
                    subjects.decode_tasks(decode_node), handoff, TaskAck,
                    node.settings.handoff_timeout_s,
                )  # fmt: skip
            except NoResponders:
                log.warning("decode node %s is gone; %s goes elsewhere", decode_node, rid)
                continue
            except BusRequestError as exc:
                # It may have taken the hand-off and lost only its answer: make sure it stops.
                log.warning("decode node %s did not answer for %s: %s", decode_node, rid, exc)
                abort = AbortRequest(request_id=rid, only_node=decode_node)
                await node.bus.publish(subjects.ABORTS, seal_abort(abort, task.request.stream_key))
                continue
            if ack.accepted:
                await self._announce_owner(rid, ack)
                return
            if ack.error_code is not None:
                await self._give_up(rid, lease, ack.reason, ack.error_code)
                return
            log.info("decode node %s refused %s: %s", decode_node, rid, ack.reason)
        await self._give_up(rid, lease, "no decode node could take the request", 503)

    async def _announce_owner(self, rid: str, ack: TaskAck) -> None:
        node = self.node
        holding = node.ledger.active(rid)
        if holding is None:
            return
        holding.stage = Stage.LEASED
        holding.owner, holding.owner_epoch = ack.node_id, ack.epoch
        notice = TokenChunk(
            request_id=rid,
            index=holding.next_index,
            token_ids=[],
            owner=ack.node_id,
            owner_epoch=ack.epoch,
        )
        await node.send(notice)

    async def _give_up(self, rid: str, lease: Lease, message: str, code: int) -> None:
        node = self.node
        if node.ledger.release(lease.token) is not None:
            await node.blocks.end(lease)
        await node.fail(rid, message, code)

    def _checksums(self, block_ids: list[int]) -> list[int]:
        cache = self.node.engine.runner.cache
        return [self.node.checksum(cache.block_buffer(b).data) for b in block_ids]

    async def on_abort(self, request_id: str) -> None:
        self.tasks.pop(request_id, None)
        self.arrived.pop(request_id, None)
        self.fetched.pop(request_id, None)

    async def drain(self, deadline: float) -> None:
        """Lets prefills in progress finish for a while, hands the rest back to their
        gateways (which resume them elsewhere), then serves the pulls still due."""
        node = self.node
        finish_by = min(deadline, time.monotonic() + DRAIN_FINISH_S)
        while self.tasks and time.monotonic() < finish_by:
            await asyncio.sleep(0.05)
        for rid in list(self.tasks):
            await self._hand_back(rid)
        while node.ledger.num_leases and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def _hand_back(self, rid: str) -> None:
        node = self.node
        holding = node.ledger.active(rid)
        await node.abort(rid)
        if holding is not None:
            notice = TokenChunk(
                request_id=rid, index=holding.next_index, token_ids=[], migrate=True
            )
            await node.send(notice)

    def describe(self, status: NodeStatus) -> None:
        status.ttft_samples = list(self.ttft_samples)
        self.ttft_samples.clear()

    async def close(self) -> None:
        await self._work.close()
