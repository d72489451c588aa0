"""Bus adapter of a decode node: KV hand-offs in (``shared.node.handoff``), tokens out;
prefill tasks of its own in (``local.py``); on drain, every request it holds is handed back
to be resumed elsewhere."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from shared.background import Background
from shared.cluster_messages import KVHandoff, NodeStatus, TaskAck
from shared.engine.types import RequestOutput
from shared.messages import TokenChunk
from shared.node.chunks import output_chunk
from shared.node.context import NodeContext
from shared.node.handoff_driver import HandoffReceiver

if TYPE_CHECKING:
    from services.decode.local import LocalPrefills

log = logging.getLogger(__name__)
#: A draining node keeps serving pulls of its blocks at least this long after handing its
#: requests back, so the nodes that resume them can pull their KV instead of recomputing.
DRAIN_LINGER_S = 2.0
#: A node sends a heartbeat as soon as sequences end, at most once in this long: schedulers
#: then never price it as decoding what it finished (local prefill, decode ranking).
FINISHED_BEAT_GAP_S = 0.05


class DecodeRole:
    """Owns when it last beat early; hand-offs are the ``receiver``'s, local tasks
    ``local``'s (None: the node takes no prefill tasks), and each request's state its
    ``NodeRequest``.

    Invariant: every output of a request still active here is sent, in order, and recorded
    for replays before the next step's.
    """

    def __init__(self, node: NodeContext, local: LocalPrefills | None = None) -> None:
        self.node = node
        self.local = local
        self._work = Background()
        self.receiver = HandoffReceiver(node, self._work.spawn)
        self._finished_beat_at = 0.0

    async def on_handoff(self, handoff: KVHandoff) -> TaskAck:
        return self.receiver.accept(handoff)

    async def admit_waiting(self) -> None:
        await self.receiver.admit_waiting()

    async def retry_admission(self) -> None:
        """Room freed by aborts (finishing sequences admit at once) lets waiting hand-offs in."""
        if self.receiver.waiting():
            await self.receiver.admit_waiting()

    async def on_outputs(self, outputs: list[RequestOutput]) -> None:
        node = self.node
        for out in outputs:
            request = node.requests.active(out.request_id)
            if request is None:
                continue  # handed back or aborted meanwhile
            if out.error is not None:
                await node.fail(out.request_id, out.error, 500)
                continue
            local = None if self.local is None else self.local.first_output(out, request)
            chunk = output_chunk(out, request.output_offset, request.num_cached_tokens)
            chunk.cached_by_tier = request.cached_by_tier
            timer = request.timer
            if local is not None:
                chunk.phases = local
            elif timer is not None:
                chunk.phases = timer.output(time.monotonic(), node.host.last_step_s)
            if timer is not None and out.finished:
                chunk.phases.update(timer.totals())
            if local is None:
                node.requests.produced(out.request_id, chunk.token_ids, chunk.logprobs)
            if out.finished:
                node.requests.finished(
                    out.request_id, time.monotonic(), chunk.finish_reason or "stop"
                )
            sending = time.monotonic()
            await node.send(chunk)
            if timer is not None:
                timer.sent(time.monotonic() - sending)
        if any(out.finished for out in outputs):
            self._beat_soon()
            if self.receiver.waiting():
                await self.receiver.admit_waiting()

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
        await self.receiver.on_abort(request_id)

    async def drain(self, deadline: float) -> None:
        """Hands every request back to its gateway at the position it reached (the gateway
        resumes it on another node), then serves pulls of this node's blocks for a while:
        the nodes that take over pull the prompt and the generated tokens from here."""
        node = self.node
        handed_back = node.requests.active_ids()
        for rid in handed_back:
            await self._hand_back(rid)
        linger_s = DRAIN_LINGER_S if handed_back else 0.0
        linger_until = min(deadline, time.monotonic() + linger_s)
        while time.monotonic() < deadline:
            if time.monotonic() >= linger_until and len(node.leases) == 0:
                return
            await asyncio.sleep(0.05)

    async def _hand_back(self, rid: str) -> None:
        request = self.node.requests.active(rid)
        if request is None:
            return
        index = request.next_index
        await self.node.abort(rid, reason="migrated")
        await self.node.send(TokenChunk(request_id=rid, index=index, token_ids=[], migrate=True))

    def describe(self, status: NodeStatus) -> None:
        status.running_seqs += len(self.receiver.waiting())
        status.handoff_samples = list(self.receiver.samples)
        self.receiver.samples.clear()
        status.arrived = self.node.requests.take_accepted()
        if self.local is not None:
            self.local.describe(status)

    async def close(self) -> None:
        await self._work.close()
        if self.local is not None:
            await self.local.close()
