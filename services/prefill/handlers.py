"""Bus adapter of a prefill node: tasks in; first tokens, KV handoffs and lease ends out."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Coroutine, Sequence
from typing import Any

import numpy as np

from services.prefill.peers import FetchedPrefix, PeerFetcher
from shared import subjects
from shared.bus import Bus
from shared.cluster_messages import KVHandoff, LeaseRelease, PinReply, PinRequest, PrefillTask
from shared.engine.async_engine import AsyncEngine
from shared.engine.sequence import FinishReason
from shared.engine.types import RequestOutput
from shared.errors import InvalidRequestError
from shared.kv.hashing import block_checksum
from shared.messages import AbortRequest
from shared.model.kv_cache import PagedKVCache
from shared.node.common import error_chunk, output_chunk, request_salt
from shared.node.leases import Lease, LeaseTable
from shared.node.pins import PinServer

log = logging.getLogger(__name__)


class PrefillHandlers:
    """Owns the tasks in flight on this node and the leases on their finished KV.

    Invariant: a task is in ``tasks`` from arrival until its first token is out; its blocks are
    then either released at once (the request is complete) or leased to its decode node.
    Blocks pinned for a peer are held under a lease too, and unpinned exactly once.
    """

    def __init__(
        self,
        bus: Bus,
        engine: AsyncEngine,
        cache: PagedKVCache,
        leases: LeaseTable,
        node_id: str,
        transfer_kind: str,
        transfer_address: bytes,
        cache_secret: str,
        fetcher: PeerFetcher,
    ) -> None:
        self.bus = bus
        self.fetcher = fetcher
        self.pins = PinServer(engine, cache, leases, transfer_kind, transfer_address)
        self._pulls: set[asyncio.Task[None]] = set()
        self.cache_secret = cache_secret
        self.engine = engine
        self.cache = cache
        self.leases = leases
        self.node_id = node_id
        self.transfer_kind = transfer_kind
        self.transfer_address = transfer_address
        self.tasks: dict[str, PrefillTask] = {}

    async def on_task(self, task: PrefillTask) -> None:
        self.tasks[task.request.request_id] = task
        if task.pulls:
            # Pulls wait on peers; in their own task they delay only this request.
            self._spawn(self._pull_then_start(task))
        else:
            await self._start(task, FetchedPrefix())

    async def _pull_then_start(self, task: PrefillTask) -> None:
        req = task.request
        salt = request_salt(self.cache_secret, req)
        fetched = await self.fetcher.fetch(list(req.prompt_token_ids), salt, task.pulls)
        await self._start(task, fetched)

    async def _start(self, task: PrefillTask, fetched: FetchedPrefix) -> None:
        """Caches what was pulled, then admits the request in the same engine call, so the
        pulled blocks are claimed before anything can evict them."""
        req = task.request
        rid = req.request_id
        params = dataclasses.replace(req.sampling.to_params(), max_tokens=1)
        prompt, salt = list(req.prompt_token_ids), request_salt(self.cache_secret, req)
        engine = self.engine.engine
        wanted = rid in self.tasks  # False: aborted while its blocks were pulled

        def admit() -> None:
            for imp, checksums in fetched.imports:
                engine.exchange.finish_import(imp, checksums)
            if wanted:
                engine.add_request(rid, prompt, params, salt, hold_blocks=True)

        try:
            await self.engine.call(admit)
        except InvalidRequestError as exc:
            self.tasks.pop(rid, None)
            await self._error(rid, str(exc), 400)

    async def on_pin(self, request: PinRequest) -> PinReply:
        """A peer asks to pull cached blocks: hold the leading ones still here under a lease."""
        return await self.pins.on_pin(request)

    @property
    def pins_served(self) -> int:
        return self.pins.pins_served

    async def close(self) -> None:
        for task in list(self._pulls):
            task.cancel()
        await self.fetcher.close()

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._pulls.add(task)
        task.add_done_callback(self._pulls.discard)

    async def on_outputs(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            task = self.tasks.pop(out.request_id, None)
            if task is not None:
                await self._first_token(task, out)

    async def on_release(self, release: LeaseRelease) -> None:
        lease = self.leases.pop(release.lease_id)
        if lease is not None:
            await self._end(lease)

    async def on_abort(self, abort: AbortRequest) -> None:
        rid = abort.request_id
        if self.tasks.pop(rid, None) is not None:
            await self.engine.call(lambda: self.engine.engine.abort_request(rid))
        lease = self.leases.pop(rid)
        if lease is not None:
            await self._end(lease)

    async def expire_leases(self) -> None:
        for lease in self.leases.expire(time.monotonic()):
            log.warning("lease %s expired before its pull; freeing its blocks", lease.lease_id)
            await self._end(lease)

    def provide(self, lease_id: str, block_ids: Sequence[int]) -> list[np.ndarray] | None:
        """Transfer-server callback: buffers of leased blocks (handoffs and pins alike)."""
        return self.pins.provide(lease_id, block_ids)

    async def _first_token(self, task: PrefillTask, out: RequestOutput) -> None:
        req = task.request
        done = out.finish_reason is FinishReason.STOP or req.sampling.max_tokens == 1
        chunk = output_chunk(out)
        if done and chunk.finish_reason is None:
            chunk.finish_reason = FinishReason.LENGTH.value
        if not done:
            chunk.finish_reason = None
        await self.bus.publish(subjects.tokens(req.request_id), chunk)
        if done:
            await self._free(req.request_id)
            return
        rid = req.request_id
        block_ids = await self.engine.call_now(lambda: self.engine.engine.held_block_ids(rid))
        if block_ids is None:  # aborted meanwhile
            return
        checksums = await asyncio.to_thread(self._checksums, block_ids)
        self.leases.grant(rid, rid, block_ids, time.monotonic())
        handoff = KVHandoff(
            request=req,
            first_token=out.new_token_ids[0],
            prefill_node=self.node_id,
            transfer_kind=self.transfer_kind,
            transfer_address=self.transfer_address,
            lease_id=rid,
            block_ids=block_ids,
            block_checksums=checksums,
            num_cached_tokens=out.num_cached_tokens,
        )
        await self.bus.publish(subjects.decode_tasks(task.decode_node), handoff)

    def _checksums(self, block_ids: list[int]) -> list[int]:
        return [block_checksum(self.cache.block_buffer(b).data) for b in block_ids]

    async def _end(self, lease: Lease) -> None:
        if lease.pinned:
            await self.pins.end(lease)
        else:
            await self._free(lease.request_id)

    async def _free(self, request_id: str) -> None:
        await self.engine.call_now(lambda: self.engine.engine.release_held(request_id))

    async def _error(self, request_id: str, message: str, code: int) -> None:
        await self.bus.publish(subjects.tokens(request_id), error_chunk(request_id, message, code))
