"""Prefill tasks a decode node computes itself (conditional disaggregation): the scheduler
sends one here instead of to a prefill node when the prompt is short or already cached here,
so its KV is never handed off. The request then runs like any other sequence of this node."""

from __future__ import annotations

import time
from dataclasses import dataclass

from shared import phases
from shared.background import Background
from shared.cluster_messages import NodeStatus, PrefillTask, TaskAck
from shared.engine.types import RequestOutput
from shared.errors import InvalidRequestError
from shared.node.chunks import request_salt
from shared.node.decode_timer import DecodeTimer
from shared.node.ledger import Holding, Stage
from shared.node.prefix import FetchedPrefix, PrefixFetcher
from shared.node.runtime import NodeRuntime
from shared.sampling_params import SamplingParams


@dataclass(slots=True)
class _Arrival:
    """A local task until its first token: when it arrived and what its pulls brought."""

    task: PrefillTask
    arrived: float
    fetched: FetchedPrefix


class LocalPrefills:
    """Owns the local tasks between their acknowledgement and their first token.

    Invariant: every accepted task is in ``pending`` until its first output (which
    ``first_output`` consumes) or its abort; after that its holding's timer times its decode
    steps as for a handed-off request, and ``DecodeRole`` sends its outputs.
    """

    def __init__(self, node: NodeRuntime, fetcher: PrefixFetcher) -> None:
        self.node = node
        self.fetcher = fetcher
        self.pending: dict[str, _Arrival] = {}
        self._work = Background()

    async def on_task(self, task: PrefillTask) -> TaskAck:
        node, req = self.node, task.request
        rid = req.request_id
        params = node.screen(req, len(self.pending), "decode node's prefill queue")
        if isinstance(params, TaskAck):
            return params
        node.ledger.open(
            rid, req.gateway_id, req.deadline_ts, req.sampling.output_offset, req.stream_key
        )
        self.pending[rid] = _Arrival(task, time.monotonic(), FetchedPrefix())
        self._work.spawn(self._start(task, params))
        return node.ack(True)

    async def _start(self, task: PrefillTask, params: SamplingParams) -> None:
        """Pulls the planned prefix and admits the request with its whole ``max_tokens``
        (``PrefixFetcher.admit``, as a prefill node does)."""
        req, node = task.request, self.node
        rid = req.request_id
        salt = request_salt(node.settings.cache_secret, req)

        def keep(fetched: FetchedPrefix) -> bool:
            arrival = self.pending.get(rid)
            if arrival is None:  # aborted while its blocks were pulled
                return False
            arrival.fetched = fetched
            return True

        prompt = list(req.prompt_token_ids)
        try:
            pulls = task.pulls if params.cache_read else []  # asked to reuse no cached block
            admitted = await self.fetcher.admit(rid, prompt, params, salt, pulls, keep)
        except InvalidRequestError as exc:
            self.pending.pop(rid, None)
            await node.fail(rid, str(exc), 400)
            return
        holding = node.ledger.active(rid) if admitted else None
        if holding is not None:
            holding.stage = Stage.RUNNING

    def first_output(self, out: RequestOutput, holding: Holding) -> dict[str, float] | None:
        """For a local task's first output: fills in what its hand-off would have carried
        (cached tokens by tier) and starts its decode timer; returns the prefill phases its
        first chunk carries. None for any other output."""
        arrival = self.pending.pop(out.request_id, None)
        if arrival is None:
            return None
        now = time.monotonic()
        block_size = self.node.engine.config.block_size
        holding.num_cached_tokens = out.num_cached_tokens
        holding.cached_by_tier = arrival.fetched.tokens_by_tier(out.num_cached_tokens, block_size)
        by_source = arrival.fetched.tokens_by_source(out.num_cached_tokens, block_size)
        self.node.metrics.served_from_cache(by_source)
        holding.timer = DecodeTimer(now, running_at=now, first_at=now, last_at=now, outputs=1)
        if out.admitted_at < arrival.arrived:
            return {}
        return phases.prefill_phases(arrival.arrived, arrival.fetched.seconds, out.admitted_at, now)

    def forget(self, request_id: str) -> None:
        self.pending.pop(request_id, None)

    def describe(self, status: NodeStatus) -> None:
        """Counts the tasks still pulling their prefix (the engine counts the others)."""
        status.local_prefill = True
        for rid, arrival in self.pending.items():
            holding = self.node.ledger.active(rid)
            if holding is not None and holding.stage is Stage.QUEUED:
                status.queued_tokens += len(arrival.task.request.prompt_token_ids)

    async def close(self) -> None:
        await self._work.close()
