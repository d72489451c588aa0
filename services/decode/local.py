"""Prefill tasks a decode node computes itself (conditional disaggregation): the scheduler
sends one here instead of to a prefill node when the prompt is short or already cached here,
so its KV is never handed off. The request then runs like any other sequence of this node."""

from __future__ import annotations

import time

from shared import phases
from shared.background import Background
from shared.cluster_messages import NodeStatus, PrefillTask, TaskAck
from shared.engine.types import RequestOutput
from shared.errors import InvalidRequestError
from shared.node.chunks import request_salt, to_wire_logprobs
from shared.node.context import NodeContext
from shared.node.decode_timer import DecodeTimer
from shared.node.prefix import FetchedPrefix, PrefixFetcher
from shared.node.requests import NodeRequest, Stage
from shared.sampling_params import SamplingParams


class LocalPrefills:
    """Owns nothing but the work it started: a local task's state is its ``NodeRequest``
    (with ``task`` set) from its acknowledgement; at its first output (``first_output``) it
    starts running, and from then on ``DecodeRole`` times and sends its outputs as for a
    handed-off request."""

    def __init__(self, node: NodeContext, fetcher: PrefixFetcher) -> None:
        self.node = node
        self.fetcher = fetcher
        self._work = Background()

    def _pending(self) -> list[NodeRequest]:
        return [r for r in self.node.requests if r.task is not None and r.before_first_token]

    async def on_task(self, task: PrefillTask) -> TaskAck:
        node, req = self.node, task.request
        params = node.screen(req, len(self._pending()), "decode node's prefill queue")
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
        """Pulls the planned prefix and admits the request with its whole ``max_tokens``
        (``PrefixFetcher.admit``, as a prefill node does)."""
        req, node = task.request, self.node
        rid = req.request_id

        def keep(fetched: FetchedPrefix) -> bool:
            request = node.requests.admitted(rid)  # None: aborted while its blocks were pulled
            if request is not None:
                request.fetched = fetched
            return request is not None

        salt = request_salt(node.settings.cache_secret, req)
        pulls = task.pulls if params.cache_read else []  # asked to reuse no cached block
        try:
            await self.fetcher.admit(rid, list(req.prompt_token_ids), params, salt, pulls, keep)
        except InvalidRequestError as exc:
            await node.fail(rid, str(exc), 400)

    def first_output(self, out: RequestOutput, request: NodeRequest) -> dict[str, float] | None:
        """For a local task's first output: records it with what its hand-off would have
        carried (cached tokens by tier), starts it running and its decode timer; returns the
        prefill phases its first chunk carries. None for any other output."""
        if request.task is None or not request.before_first_token:
            return None
        now = time.monotonic()
        block_size = self.node.block_size
        fetched = request.fetched or FetchedPrefix()
        cached = out.num_cached_tokens
        by_tier = fetched.tokens_by_tier(cached, block_size)
        logprobs = to_wire_logprobs(out.new_logprobs)
        self.node.requests.first_token(
            out.request_id, list(out.new_token_ids), logprobs, cached, by_tier
        )
        self.node.requests.running(out.request_id)
        self.node.metrics.served_from_cache(fetched.tokens_by_source(cached, block_size))
        request.timer = DecodeTimer(now, running_at=now, first_at=now, last_at=now, outputs=1)
        if out.admitted_at < request.arrived:
            return {}
        return phases.prefill_phases(request.arrived, fetched.seconds, out.admitted_at, now)

    def describe(self, status: NodeStatus) -> None:
        """Counts the tasks still pulling their prefix (the engine counts the others)."""
        status.local_prefill = True
        for request in self._pending():
            if request.stage is Stage.QUEUED and request.task is not None:
                status.queued_tokens += len(request.task.request.prompt_token_ids)

    async def close(self) -> None:
        await self._work.close()
