"""Bus adapter of a prefill node: tasks in (acknowledged), first tokens out, KV handed to the
first decode node that acknowledges it (``shared.node.handoff``)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque

from shared import phases
from shared.background import Background
from shared.cluster_messages import NodeStatus, PrefillTask, TaskAck
from shared.engine.sequence import FinishReason
from shared.engine.types import RequestOutput
from shared.errors import InvalidRequestError
from shared.messages import TokenChunk
from shared.node.chunks import output_chunk, request_salt
from shared.node.context import NodeContext
from shared.node.handoff_driver import HandoffSender
from shared.node.prefix import FetchedPrefix, PrefixFetcher
from shared.node.requests import NodeRequest
from shared.sampling_params import SamplingParams

#: While draining, tasks still prefilling after this long are handed back to their gateway.
DRAIN_FINISH_S = 5.0


class PrefillRole:
    """Owns the predicted-vs-actual first-token samples; each task's state is its
    ``NodeRequest``.

    Invariant: an accepted task ends in exactly one of: a finished request (first token was
    also the last), a lease taken by a decode node (announced to the gateway by an owner
    chunk), an error chunk, an abort, or (while draining) a migrate chunk.
    """

    def __init__(self, node: NodeContext, fetcher: PrefixFetcher) -> None:
        self.node = node
        self.fetcher = fetcher
        self.sender = HandoffSender(node)
        # (predicted, actual) seconds from arrival to first token, for the scheduler.
        self.ttft_samples: deque[tuple[float, float]] = deque(maxlen=64)
        self._work = Background()

    def _prefilling(self) -> list[NodeRequest]:
        return [r for r in self.node.requests if r.before_first_token]

    async def on_task(self, task: PrefillTask) -> TaskAck:
        node, req = self.node, task.request
        params = node.screen(req, len(self._prefilling()), "prefill queue")
        if isinstance(params, TaskAck):
            return params
        request = NodeRequest(
            req.request_id, req.gateway_id, req.deadline_ts, req.sampling.output_offset,
            req.stream_key, arrived=time.monotonic(), task=task,
        )  # fmt: skip
        node.requests.accept(request)
        self._work.spawn(self._start(task, params))
        return node.ack(True)

    async def _start(self, task: PrefillTask, params: SamplingParams) -> None:
        """Pulls the planned prefix and admits the request for its first token, holding its
        blocks for the hand-off (``PrefixFetcher.admit``)."""
        req, node = task.request, self.node
        rid = req.request_id

        def keep(fetched: FetchedPrefix) -> bool:
            request = node.requests.admitted(rid)  # None: aborted while its blocks were pulled
            if request is not None:
                request.fetched = fetched
            return request is not None

        first_only = dataclasses.replace(params, max_tokens=1)
        salt = request_salt(node.settings.cache_secret, req)
        pulls = task.pulls if params.cache_read else []
        try:
            await self.fetcher.admit(
                rid, list(req.prompt_token_ids), first_only, salt, pulls, keep, hold_blocks=True
            )
        except InvalidRequestError as exc:
            await node.fail(rid, str(exc), 400)

    async def on_outputs(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            request = self.node.requests.active(out.request_id)
            if request is None or request.task is None or not request.before_first_token:
                continue
            if out.error is not None:
                await self.node.fail(out.request_id, out.error, 500)
                continue
            if request.task.predicted_ttft_s > 0:
                actual = time.monotonic() - request.arrived
                self.ttft_samples.append((request.task.predicted_ttft_s, actual))
            await self._first_token(request, request.task, out)

    async def _first_token(
        self, request: NodeRequest, task: PrefillTask, out: RequestOutput
    ) -> None:
        node, req = self.node, task.request
        rid = req.request_id
        output_at = time.monotonic()
        fetched = request.fetched or FetchedPrefix()
        done = out.finish_reason is FinishReason.STOP or req.sampling.max_tokens == 1
        cached = out.num_cached_tokens
        chunk = output_chunk(out, req.sampling.output_offset, cached)
        if out.admitted_at >= request.arrived:
            chunk.phases = phases.prefill_phases(
                request.arrived, fetched.seconds, out.admitted_at, time.monotonic()
            )
        chunk.cached_by_tier = fetched.tokens_by_tier(cached, node.block_size)
        node.metrics.served_from_cache(fetched.tokens_by_source(cached, node.block_size))
        chunk.finish_reason = (chunk.finish_reason or FinishReason.LENGTH.value) if done else None
        node.requests.first_token(
            rid, chunk.token_ids, chunk.logprobs, cached, chunk.cached_by_tier
        )
        await node.send(chunk)
        if done:
            node.requests.finished(rid, time.monotonic(), chunk.finish_reason or "length")
            await node.host.release_held(rid)
            return
        await self.sender.send(task, chunk, cached, output_at)

    async def on_abort(self, request_id: str) -> None:
        """Nothing of a task lives outside its request and its lease."""

    async def drain(self, deadline: float) -> None:
        """Lets prefills in progress finish for a while, hands the rest back to their
        gateways (which resume them elsewhere), then serves the pulls still due."""
        node = self.node
        finish_by = min(deadline, time.monotonic() + DRAIN_FINISH_S)
        while self._prefilling() and time.monotonic() < finish_by:
            await asyncio.sleep(0.05)
        for request in self._prefilling():
            await self._hand_back(request)
        while len(node.leases) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def _hand_back(self, request: NodeRequest) -> None:
        index = request.next_index
        await self.node.abort(request.request_id)
        notice = TokenChunk(request_id=request.request_id, index=index, token_ids=[], migrate=True)
        await self.node.send(notice)

    def describe(self, status: NodeStatus) -> None:
        status.ttft_samples = list(self.ttft_samples)
        self.ttft_samples.clear()

    async def close(self) -> None:
        await self._work.close()
