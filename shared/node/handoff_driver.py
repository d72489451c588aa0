"""Runs the hand-off's decisions (``handoff.py``) against the node: leases, the bus, the
engine host and the puller."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from shared import subjects
from shared.bus import BusRequestError, NoResponders
from shared.cluster_messages import KVHandoff, LeaseRelease, PrefillTask, TaskAck
from shared.engine.types import ImportSlot
from shared.errors import InvalidRequestError
from shared.messages import AbortRequest, TokenChunk
from shared.node.chunks import request_salt
from shared.node.context import NodeContext
from shared.node.decode_timer import DecodeTimer
from shared.node.handoff import (
    AfterPull,
    GiveUp,
    Offer,
    OfferAnswer,
    Owned,
    PullSpan,
    Reply,
    Reserved,
    Stop,
    Withdraw,
    after_pull,
    after_reserve,
    next_offer,
    pull_span,
)
from shared.node.leases import Lease, LeaseKind
from shared.node.puller import HANDOFF, PullSource
from shared.node.requests import NodeRequest, Stage
from shared.stream_auth import seal_abort

log = logging.getLogger(__name__)
#: Hand-off timings kept between heartbeats (the scheduler fits its hand-off model to them).
MAX_HANDOFF_SAMPLES = 64
Spawn = Callable[[Coroutine[Any, Any, None]], Any]


class HandoffSender:
    """A prefill node's side: owns nothing beyond the round it runs; the request's lease is
    in the node's lease table from the offer until a decode node releases it, the request
    fails, or it is aborted."""

    def __init__(self, node: NodeContext) -> None:
        self.node = node

    async def send(
        self, task: PrefillTask, first: TokenChunk, cached: int, ready_at: float
    ) -> None:
        """Leases the finished prompt's held blocks and offers them to the task's ranked
        decode nodes; ``first`` is the chunk that carried the first token out."""
        node, req = self.node, task.request
        rid = req.request_id
        block_ids = await node.host.held_block_ids(rid)
        if block_ids is None:
            return  # aborted meanwhile; the abort freed the blocks
        if node.requests.active(rid) is None:
            await node.host.release_held(rid)  # aborted between its token and now
            return
        lease = node.leases.grant(LeaseKind.HANDOFF, time.monotonic(), block_ids, rid)
        node.requests.offered(rid)
        checksums = await asyncio.to_thread(node.host.block_checksums, block_ids)
        handoff = KVHandoff(
            request=req,
            first_token=first.token_ids[0],
            prefill_node=node.node_id,
            transfer_kind=node.settings.transfer,
            transfer_address=node.transfer_address,
            lease_id=lease.token,
            block_ids=block_ids,
            block_checksums=checksums,
            num_cached_tokens=cached,
            cached_by_tier=first.cached_by_tier,
            first_logprob=first.logprobs[0] if first.logprobs else None,
            prepared_s=time.monotonic() - ready_at,
        )
        await self._offer_round(task, handoff, lease)

    async def _offer_round(self, task: PrefillTask, handoff: KVHandoff, lease: Lease) -> None:
        node, rid = self.node, task.request.request_id
        remaining, answer = tuple(task.decode_nodes), None
        while True:
            active = node.requests.active(rid) is not None
            effects, remaining = next_offer(remaining, answer, active)
            for effect in effects:
                if isinstance(effect, Withdraw):
                    abort = AbortRequest(request_id=rid, only_node=effect.node)
                    sealed = seal_abort(abort, task.request.stream_key)
                    await node.bus.publish(subjects.ABORTS, sealed)
                elif isinstance(effect, Offer):
                    answer = await self._ask(effect.node, handoff)
                elif isinstance(effect, Owned):
                    await self._announce_owner(rid, effect)
                    return
                elif isinstance(effect, GiveUp):
                    await node.end_lease(lease)
                    await node.fail(rid, effect.message, effect.code)
                    return
                elif isinstance(effect, Stop):
                    return

    async def _ask(self, decode_node: str, handoff: KVHandoff) -> OfferAnswer:
        node, rid = self.node, handoff.request.request_id
        subject, timeout = subjects.decode_tasks(decode_node), node.settings.handoff_timeout_s
        try:
            ack = await node.bus.request(subject, handoff, TaskAck, timeout)
        except NoResponders:
            log.warning("decode node %s is gone; %s goes elsewhere", decode_node, rid)
            return OfferAnswer(decode_node, Reply.GONE)
        except BusRequestError as exc:
            log.warning("decode node %s did not answer for %s: %s", decode_node, rid, exc)
            return OfferAnswer(decode_node, Reply.SILENT)
        if ack.accepted:
            return OfferAnswer(decode_node, Reply.ACCEPTED, epoch=ack.epoch)
        if ack.error_code is not None:
            return OfferAnswer(decode_node, Reply.FAILED, ack.reason, ack.error_code)
        log.info("decode node %s refused %s: %s", decode_node, rid, ack.reason)
        return OfferAnswer(decode_node, Reply.REFUSED, ack.reason)

    async def _announce_owner(self, rid: str, owned: Owned) -> None:
        request = self.node.requests.leased(rid, owned.node, owned.epoch)
        if request is None:
            return
        notice = TokenChunk(
            request_id=rid,
            index=request.next_index,
            token_ids=[],
            owner=owned.node,
            owner_epoch=owned.epoch,
        )
        await self.node.send(notice)


class HandoffReceiver:
    """A decode node's side: owns the admission lock and the hand-off timings.

    Invariants: every accepted hand-off ends in exactly one ``LeaseRelease`` to its prefill
    node, and in a running sequence, an error, an abort or a migration; hand-offs get room in
    arrival order (they wait in the request table as QUEUED requests with a ``handoff``).
    """

    def __init__(self, node: NodeContext, spawn: Spawn) -> None:
        self.node = node
        self.spawn = spawn
        # (blocks pulled, seconds from the first token on the prefill node to running here)
        self.samples: deque[tuple[int, float]] = deque(maxlen=MAX_HANDOFF_SAMPLES)
        self._admitting = asyncio.Lock()

    def waiting(self) -> list[NodeRequest]:
        return [r for r in self.node.requests if r.handoff is not None and r.stage is Stage.QUEUED]

    def accept(self, handoff: KVHandoff) -> TaskAck:
        node, req = self.node, handoff.request
        params = node.screen(req, len(self.waiting()), "decode queue")
        if isinstance(params, TaskAck):
            return params
        rid = req.request_id
        request = NodeRequest(
            rid, req.gateway_id, req.deadline_ts, req.sampling.output_offset, req.stream_key,
            arrived=time.monotonic(), handoff=handoff,
        )  # fmt: skip
        node.requests.accept(request)
        # The first token is this node's output too, so a replay can start from it.
        logprobs = [handoff.first_logprob] if handoff.first_logprob else None
        node.requests.first_token(
            rid, [handoff.first_token], logprobs, handoff.num_cached_tokens, handoff.cached_by_tier
        )
        request.timer = DecodeTimer(request.arrived)
        self.spawn(self.admit_waiting())
        return node.ack(True)

    async def admit_waiting(self) -> None:
        """Reserves room for waiting hand-offs in arrival order while the pool has it; each
        reserved one is then pulled in its own task, so a slow peer delays only its own."""
        async with self._admitting:
            while waiting := self.waiting():
                request = waiting[0]
                assert request.handoff is not None
                slot, refused = await self._reserve(request.handoff)
                outcome = after_reserve(slot, refused)
                if outcome is Reserved.NO_ROOM:
                    return
                if outcome is Reserved.REFUSED:
                    continue
                assert slot is not None
                if self.node.requests.admitted(request.request_id) is None:
                    await self.node.host.abort(request.request_id)  # aborted while reserved
                    continue
                self.spawn(self._complete(request, request.handoff, slot))

    async def _reserve(self, handoff: KVHandoff) -> tuple[ImportSlot | None, bool]:
        node, req = self.node, handoff.request
        salt = request_salt(node.settings.cache_secret, req)
        try:
            slot = await node.host.begin_import(
                req.request_id, list(req.prompt_token_ids), handoff.first_token,
                req.sampling.to_params(), salt,
            )  # fmt: skip
        except InvalidRequestError as exc:
            await self.release(handoff)
            await node.fail(req.request_id, str(exc), 400)
            return None, True
        return slot, False

    async def _complete(self, request: NodeRequest, handoff: KVHandoff, slot: ImportSlot) -> None:
        node, rid = self.node, request.request_id
        span = pull_span(handoff.block_ids, handoff.block_checksums, slot)
        ok = await self._pull(handoff, span, slot.block_ids)
        await self.release(handoff)
        outcome = after_pull(node.requests.active(rid) is not None, ok)
        if outcome is AfterPull.ABORT:
            await node.host.abort(rid)
            return
        node.requests.running(rid)
        timer = request.timer
        if timer is not None:
            timer.running_at = time.monotonic()
            if outcome is AfterPull.RUN:
                seconds = handoff.prepared_s + timer.running_at - timer.received_at
                self.samples.append((len(slot.block_ids), seconds))
        await node.host.finish_import(rid, outcome is AfterPull.RUN)

    async def _pull(self, handoff: KVHandoff, span: PullSpan, block_ids: list[int]) -> bool:
        """False means the engine recomputes the prompt instead (slower, never wrong)."""
        if not span.matches:
            log.warning("a hand-off does not match its prompt; recomputing")
            return False
        if not span.source_ids:
            return True
        source = PullSource(
            handoff.prefill_node, handoff.transfer_kind, handoff.transfer_address,
            handoff.lease_id, span.source_ids, span.checksums, HANDOFF,
        )  # fmt: skip
        return await self.node.puller.pull(source, block_ids) == len(span.source_ids)

    async def release(self, handoff: KVHandoff) -> None:
        release = LeaseRelease(lease_id=handoff.lease_id)
        try:
            await self.node.bus.publish(subjects.lease_releases(handoff.prefill_node), release)
        except Exception as exc:  # the lease then expires on its own
            log.warning("could not release a lease: %s", exc)

    async def on_abort(self, request_id: str) -> None:
        request = self.node.requests.active(request_id)
        if request is not None and request.handoff is not None and request.stage is Stage.QUEUED:
            await self.release(request.handoff)
