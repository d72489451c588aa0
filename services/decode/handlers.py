"""Bus adapter of a decode node: KV hand-offs in (acknowledged), pulled into the pool, tokens
out; prefill tasks of its own in (``local.py``); on drain, every request it holds is handed
back to be resumed elsewhere."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Literal

from shared import subjects
from shared.background import Background
from shared.cluster_messages import KVHandoff, LeaseRelease, NodeStatus, TaskAck
from shared.engine.types import ImportSlot, RequestOutput
from shared.errors import InvalidRequestError
from shared.messages import TokenChunk
from shared.node.chunks import output_chunk, request_salt
from shared.node.decode_timer import DecodeTimer
from shared.node.ledger import Stage
from shared.node.puller import HANDOFF, PullSource
from shared.node.runtime import NodeRuntime

if TYPE_CHECKING:
    from services.decode.local import LocalPrefills

log = logging.getLogger(__name__)
#: A draining node keeps serving pulls of its blocks at least this long after handing its
#: requests back, so the nodes that resume them can pull their KV instead of recomputing.
DRAIN_LINGER_S = 2.0
#: Hand-off timings kept between heartbeats (the scheduler fits its hand-off model to them).
MAX_HANDOFF_SAMPLES = 64
#: A node sends a heartbeat as soon as sequences end, at most once in this long: schedulers
#: then never price it as decoding what it finished (local prefill, decode ranking).
FINISHED_BEAT_GAP_S = 0.05


class DecodeRole:
    """Owns the hand-offs waiting for room, the pulls in flight and the cached-token counts
    of the requests it runs.

    Invariants: every accepted hand-off ends in exactly one ``LeaseRelease`` to its prefill
    node, and in a running sequence, an error chunk, an abort or (draining) a migrate chunk.
    Hand-offs get room in arrival order. ``local`` (None: the node takes no prefill tasks)
    owns the requests prefilled here until their first output.
    """

    def __init__(self, node: NodeRuntime, local: LocalPrefills | None = None) -> None:
        self.node = node
        self.local = local
        self.waiting: deque[KVHandoff] = deque()
        # (blocks pulled, seconds from the first token on the prefill node to running here)
        self.handoff_samples: deque[tuple[int, float]] = deque(maxlen=MAX_HANDOFF_SAMPLES)
        self._work = Background()
        self._admitting = asyncio.Lock()
        self._finished_beat_at = 0.0

    async def on_handoff(self, handoff: KVHandoff) -> TaskAck:
        node, req = self.node, handoff.request
        rid = req.request_id
        params = node.screen(req, len(self.waiting), "decode queue")
        if isinstance(params, TaskAck):
            return params
        holding = node.ledger.open(
            rid, req.gateway_id, req.deadline_ts, req.sampling.output_offset, req.stream_key
        )
        # The first token is this node's output too, so a replay can start from it.
        node.ledger.record(
            rid, [handoff.first_token], [handoff.first_logprob] if handoff.first_logprob else None
        )
        holding.num_cached_tokens = handoff.num_cached_tokens
        holding.cached_by_tier = dict(handoff.cached_by_tier)
        holding.timer = DecodeTimer(time.monotonic())
        self.waiting.append(handoff)
        self._work.spawn(self.admit_waiting())
        return self.node.ack(True)

    async def admit_waiting(self) -> None:
        """Reserves room for waiting hand-offs in arrival order while the pool has it; each
        reserved one is then pulled in its own task, so a slow peer delays only its own."""
        async with self._admitting:
            while self.waiting:
                handoff = self.waiting[0]
                slot = await self._reserve(handoff)
                if slot is False:
                    return
                self.waiting.popleft()
                if slot is not None:
                    self._work.spawn(self._complete(handoff, slot))

    async def _reserve(self, handoff: KVHandoff) -> ImportSlot | Literal[False] | None:
        """The reserved blocks; None if the hand-off was refused (its error is sent); False
        if the pool has no room yet."""
        node, req = self.node, handoff.request
        rid = req.request_id
        salt = request_salt(node.settings.cache_secret, req)
        try:
            slot = await node.host.begin_import(
                rid, list(req.prompt_token_ids), handoff.first_token, req.sampling.to_params(),
                salt,
            )  # fmt: skip
        except InvalidRequestError as exc:
            await self._release(handoff)
            await node.fail(rid, str(exc), 400)
            return None
        return False if slot is None else slot

    async def _complete(self, handoff: KVHandoff, slot: ImportSlot) -> None:
        node, rid = self.node, handoff.request.request_id
        ok = await self._pull(handoff, slot)
        await self._release(handoff)
        holding = node.ledger.active(rid)
        if holding is None:  # aborted while it was pulled
            await node.host.abort(rid)
            return
        holding.stage = Stage.RUNNING
        timer = holding.timer
        if timer is not None:
            timer.running_at = time.monotonic()
            if ok:
                seconds = handoff.prepared_s + timer.running_at - timer.received_at
                self.handoff_samples.append((len(slot.block_ids), seconds))
        await node.host.finish_import(rid, ok)

    async def _pull(self, handoff: KVHandoff, slot: ImportSlot) -> bool:
        """Fills the slot's blocks from the prefill node; False means the engine recomputes
        the prompt instead (slower, never wrong)."""
        source_ids = handoff.block_ids[slot.first_block :]
        checksums = handoff.block_checksums[slot.first_block :]
        if len(source_ids) != len(slot.block_ids) or len(checksums) != len(source_ids):
            log.warning("a hand-off does not match its prompt; recomputing")
            return False
        if not source_ids:
            return True
        source = PullSource(
            handoff.prefill_node,
            handoff.transfer_kind,
            handoff.transfer_address,
            handoff.lease_id,
            source_ids,
            checksums,
            HANDOFF,
        )
        return await self.node.puller.pull(source, slot.block_ids) == len(source_ids)

    async def _release(self, handoff: KVHandoff) -> None:
        release = LeaseRelease(lease_id=handoff.lease_id)
        try:
            await self.node.bus.publish(subjects.lease_releases(handoff.prefill_node), release)
        except Exception as exc:  # the lease then expires on its own
            log.warning("could not release a lease: %s", exc)

    async def on_outputs(self, outputs: list[RequestOutput]) -> None:
        node = self.node
        for out in outputs:
            rid = out.request_id
            holding = node.ledger.active(rid)
            if holding is None:
                continue  # handed back or aborted meanwhile
            if out.error is not None:
                if self.local is not None:
                    self.local.forget(rid)
                await node.fail(rid, out.error, 500)
                continue
            prefilled = None if self.local is None else self.local.first_output(out, holding)
            chunk = output_chunk(out, holding.output_offset, holding.num_cached_tokens)
            chunk.cached_by_tier = holding.cached_by_tier
            timer = holding.timer
            if prefilled is not None:
                chunk.phases = prefilled
            elif timer is not None:
                chunk.phases = timer.output(time.monotonic(), node.host.last_step_s)
            if timer is not None and out.finished:
                chunk.phases.update(timer.totals())
            node.ledger.record(rid, chunk.token_ids, chunk.logprobs)
            if out.finished:
                node.ledger.finish(rid, time.monotonic(), reason=chunk.finish_reason)
            sending = time.monotonic()
            await node.send(chunk)
            if timer is not None:
                timer.sent(time.monotonic() - sending)
        if any(out.finished for out in outputs):
            self._beat_soon()
            if self.waiting:
                await self.admit_waiting()

    def _beat_soon(self) -> None:
        now = time.monotonic()
        if now - self._finished_beat_at >= FINISHED_BEAT_GAP_S:
            self._finished_beat_at = now
            self._work.spawn(self._beat())

    async def _beat(self) -> None:
        try:
            await self.node.beat_now()
        except Exception as exc:  # the regular heartbeat follows anyway
            log.debug("an extra heartbeat failed: %s", exc)

    async def on_abort(self, request_id: str) -> None:
        if self.local is not None:
            self.local.forget(request_id)
        for handoff in list(self.waiting):
            if handoff.request.request_id == request_id:
                self.waiting.remove(handoff)
                await self._release(handoff)

    async def drain(self, deadline: float) -> None:
        """Hands every request back to its gateway at the position it reached (the gateway
        resumes it on another node), then serves pulls of this node's blocks for a while:
        the nodes that take over pull the prompt and the generated tokens from here."""
        node = self.node
        handed_back = node.ledger.active_ids()
        for rid in handed_back:
            await self._hand_back(rid)
        linger_s = DRAIN_LINGER_S if handed_back else 0.0
        linger_until = min(deadline, time.monotonic() + linger_s)
        while time.monotonic() < deadline:
            if time.monotonic() >= linger_until and node.ledger.num_leases == 0:
                return
            await asyncio.sleep(0.05)

    async def _hand_back(self, rid: str) -> None:
        node = self.node
        holding = node.ledger.active(rid)
        if holding is None:
            return
        index = holding.next_index
        await node.abort(rid, reason="migrated")
        await node.send(TokenChunk(request_id=rid, index=index, token_ids=[], migrate=True))

    def describe(self, status: NodeStatus) -> None:
        status.running_seqs += len(self.waiting)
        status.handoff_samples = list(self.handoff_samples)
        self.handoff_samples.clear()
        if self.local is not None:
            self.local.describe(status)

    async def close(self) -> None:
        await self._work.close()
        if self.local is not None:
            await self.local.close()
