"""Bus adapter of a decode node: KV handoffs in, pulled into the pool, tokens out."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Coroutine
from typing import Any, Literal

from shared import subjects
from shared.bus import Bus
from shared.cluster_messages import KVHandoff, LeaseRelease
from shared.engine.async_engine import AsyncEngine
from shared.engine.types import ImportSlot, RequestOutput
from shared.errors import InvalidRequestError
from shared.kv.hashing import block_checksum
from shared.messages import AbortRequest
from shared.model.kv_cache import PagedKVCache
from shared.node.common import FetchBandwidth, error_chunk, output_chunk, request_salt
from shared.transfer.base import TransferClient, TransferError, create_client

log = logging.getLogger(__name__)


class DecodeHandlers:
    """Owns handoffs waiting for room, pulls in flight and one transfer client per kind.

    Invariant: every handoff ends in exactly one ``LeaseRelease`` to its prefill node, and in
    either a running sequence or an error chunk to its gateway — never in silence.
    """

    def __init__(
        self,
        bus: Bus,
        engine: AsyncEngine,
        cache: PagedKVCache,
        cache_secret: str,
        bandwidth: FetchBandwidth | None = None,
    ) -> None:
        self.bus = bus
        self.bandwidth = bandwidth or FetchBandwidth()
        self.cache_secret = cache_secret
        self.engine = engine
        self.cache = cache
        self.waiting: deque[KVHandoff] = deque()
        self.aborted: set[str] = set()
        self.cached_tokens: dict[str, int] = {}
        self.clients: dict[str, TransferClient] = {}
        self.pulls_ok = 0
        self.pulls_failed = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._admitting = asyncio.Lock()  # one admission at a time keeps arrival order

    async def on_handoff(self, handoff: KVHandoff) -> None:
        self.waiting.append(handoff)
        await self.retry_waiting()

    async def on_outputs(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            chunk = output_chunk(out, self.cached_tokens.get(out.request_id))
            await self.bus.publish(subjects.tokens(out.request_id), chunk)
            if out.finished:
                self.cached_tokens.pop(out.request_id, None)
        if any(out.finished for out in outputs):
            await self.retry_waiting()

    async def on_abort(self, abort: AbortRequest) -> None:
        rid = abort.request_id
        for handoff in list(self.waiting):
            if handoff.request.request_id == rid:
                self.waiting.remove(handoff)
                await self._release(handoff)
                return
        self.aborted.add(rid)
        await self.engine.call(lambda: self.engine.engine.abort_request(rid))
        self.cached_tokens.pop(rid, None)

    async def retry_waiting(self) -> None:
        """Reserves room for waiting handoffs in arrival order while the pool has it; each
        reserved one is then pulled in its own task, so a slow peer delays only its own."""
        async with self._admitting:
            while self.waiting:
                handoff = self.waiting[0]
                slot = await self._reserve(handoff)
                if slot is False:
                    return
                self.waiting.popleft()
                if slot is not None:
                    self._spawn(self._complete(handoff, slot))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for client in self.clients.values():
            await client.close()

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reserve(self, handoff: KVHandoff) -> ImportSlot | Literal[False] | None:
        """The reserved blocks; None if the handoff was refused (its error is sent); False if
        the pool has no room yet."""
        req = handoff.request
        rid = req.request_id
        params = req.sampling.to_params()
        prompt, salt = list(req.prompt_token_ids), request_salt(self.cache_secret, req)
        try:
            slot = await self.engine.call(
                lambda: self.engine.engine.begin_import(
                    rid, prompt, handoff.first_token, params, salt
                )
            )
        except InvalidRequestError as exc:
            await self._release(handoff)
            await self._error(rid, str(exc), 400)
            return None
        if slot is None:
            return False
        self.cached_tokens[rid] = handoff.num_cached_tokens
        return slot

    async def _complete(self, handoff: KVHandoff, slot: ImportSlot) -> None:
        rid = handoff.request.request_id
        ok = await self._pull(handoff, slot)
        await self._release(handoff)
        if rid in self.aborted:
            self.aborted.discard(rid)
            await self.engine.call(lambda: self.engine.engine.abort_request(rid))
            return
        await self.engine.call(lambda: self.engine.engine.finish_import(rid, ok))

    async def _pull(self, handoff: KVHandoff, slot: ImportSlot) -> bool:
        """Fills the slot's blocks from the prefill node and verifies every checksum; False
        means the engine recomputes the prompt instead."""
        source_ids = handoff.block_ids[slot.first_block :]
        expected = handoff.block_checksums[slot.first_block :]
        if len(source_ids) != len(slot.block_ids) or len(expected) != len(source_ids):
            log.warning("handoff %s does not match its prompt; recomputing", handoff.lease_id)
            return False
        if not source_ids:
            return True
        dest = [self.cache.block_buffer(b) for b in slot.block_ids]
        started = time.perf_counter()
        try:
            client = self._client(handoff.transfer_kind)
            received = await client.pull(
                handoff.transfer_address, handoff.lease_id, source_ids, dest
            )
        except TransferError as exc:
            self.pulls_failed += 1
            log.warning("pull of %s failed (%s); recomputing", handoff.lease_id, exc)
            return False
        self.bandwidth.record(handoff.prefill_node, received, time.perf_counter() - started)
        sums = await asyncio.to_thread(lambda: [block_checksum(d.data) for d in dest])
        if sums != expected:
            self.pulls_failed += 1
            log.warning("pull of %s had a corrupt block; recomputing", handoff.lease_id)
            return False
        self.pulls_ok += 1
        return True

    def _client(self, kind: str) -> TransferClient:
        client = self.clients.get(kind)
        if client is None:
            client = self.clients[kind] = create_client(kind)
        return client

    async def _release(self, handoff: KVHandoff) -> None:
        release = LeaseRelease(lease_id=handoff.lease_id)
        await self.bus.publish(subjects.lease_releases(handoff.prefill_node), release)

    async def _error(self, request_id: str, message: str, code: int) -> None:
        await self.bus.publish(subjects.tokens(request_id), error_chunk(request_id, message, code))
