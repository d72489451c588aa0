"""The UCX block server: answers pull requests that arrive on this process's UCX worker."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Sequence

import numpy as np

from shared.lifecycle import Tasks
from shared.transfer.base import (
    DEFAULT_SEND_TIMEOUT_S,
    BlockProvider,
    BufferLike,
    TransferError,
)
from shared.transfer.ucx import (
    ADDRESS_PREFIX,
    REQUEST_TAG,
    Posted,
    block_tag,
    load_ucx,
    reply_tag,
)
from shared.transfer.wire import MAX_REQUEST_BYTES, Answer, PullRequest, answer, decode_request

log = logging.getLogger(__name__)

_EMPTY = np.empty(0, dtype=np.uint8)
_DRAIN_S = 5.0
_serving: UcxTransferServer | None = None


class UcxTransferServer:
    """Serves pulls on this process's UCX worker.

    Owns the request receiver and one task per pull; endpoints back to clients are the
    process's. Invariant: at most one is started per process, since requests arrive on one
    fixed tag of the process-wide worker.
    """

    def __init__(
        self, provider: BlockProvider, *, send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S
    ) -> None:
        self._ucx = load_ucx()  # fails here, so a caller can still pick another transport
        self._provider = provider
        self._send_timeout_s = send_timeout_s
        self._address = b""
        self._receiver: asyncio.Task[None] | None = None
        self._tasks = Tasks("ucx transfer server")  # the receiver, and answers being sent
        self._closing = False
        self.bytes_sent = 0
        self.blocks_sent = 0

    @property
    def address(self) -> bytes:
        if not self._address:
            raise TransferError("the UCX transfer server is not started")
        return self._address

    async def start(self) -> None:
        global _serving
        if _serving is not None:
            raise TransferError("a UCX transfer server is already running in this process")
        self._address = ADDRESS_PREFIX + self._ucx.attach()
        _serving = self
        self._receiver = self._tasks.spawn(self._receive_requests(), "receive")

    async def close(self) -> None:
        global _serving
        if _serving is not self:
            return
        self._closing = True
        await self._wake_receiver()
        # Pulls in flight finish first: their clients read this process's memory directly, and
        # a server vanishing in the middle of such a read fails their pulls (or, with error
        # handling off, aborts them).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_DRAIN_S):
                await self._tasks.wait()
        await self._tasks.close()
        _serving = None

    async def _wake_receiver(self) -> None:
        # A posted worker-level receive cannot be cancelled by itself. Completing it with a
        # message to ourselves stops it cleanly, and keeps it from swallowing the first request
        # meant for a server started later in this process.
        assert self._receiver is not None
        try:
            async with asyncio.timeout(2.0):
                ep = self._ucx.endpoints.get(self._ucx.address)
                await self._ucx.post_sends(ep, ((memoryview(b"\0"), REQUEST_TAG),)).wait()
                await self._receiver
        except Exception as exc:
            log.warning("UCX transfer receiver did not stop cleanly: %r", exc)
            self._receiver.cancel()

    async def _receive_requests(self) -> None:
        buf = np.empty(MAX_REQUEST_BYTES, dtype=np.uint8)
        # Tag receives match messages from every sender; posting through the endpoint to
        # ourselves gives it the same ``Posted`` wait, and progress, as every other request.
        own = self._ucx.endpoints.get(self._ucx.address)
        while not self._closing:
            try:
                # Kept until the next request is posted: freeing it waits until the answer is.
                received = self._ucx.post_recvs(own, ((buf, REQUEST_TAG),))
                await received.wait(idle=True)
            except Exception as exc:  # e.g. a request over the size limit: drop that one
                log.warning("dropped a UCX transfer request: %r", exc)
                await asyncio.sleep(0.01)  # a broken worker must not turn this into a spin
                continue
            if self._closing:
                return
            try:
                request = decode_request(buf.data)
            except ValueError as exc:
                log.warning("dropped a malformed UCX transfer request: %s", exc)
                continue
            # Answered right here, not in a task of its own: the client is already waiting,
            # and a task would start only on a later turn of the loop.
            self._tasks.spawn(self._deliver(request, *self._answer(request)), "deliver")

    def _answer(self, request: PullRequest) -> tuple[Answer, Posted | Exception]:
        """Posts the blocks and the reply; returns the answer and its sends, or why not."""
        rid = request.request_id
        result = answer(self._provider, request)
        # On an error reply the client's block receives are posted all the same; empty
        # messages complete them without touching its buffers.
        views: Sequence[BufferLike] = result.views or [_EMPTY] * len(request.block_ids)
        try:
            ep = self._ucx.endpoints.get(request.reply_to)
            # The reply goes last: the client waits for every message anyway, and the first
            # block's transfer starts sooner without the reply ahead of it. A generator, so
            # that block goes out before the other messages are even put together.
            blocks = ((view, block_tag(rid, i)) for i, view in enumerate(views))
            reply = ((memoryview(result.reply.encode()), reply_tag(rid)),)
            sends = self._ucx.post_sends(ep, itertools.chain(blocks, reply))
        except Exception as exc:  # an unreachable client address
            return result, exc
        return result, sends

    async def _deliver(
        self, request: PullRequest, result: Answer, sends: Posted | Exception
    ) -> None:
        try:
            if isinstance(sends, Exception):
                raise sends
            async with asyncio.timeout(self._send_timeout_s):
                await sends.wait()
        except Exception as exc:
            # The client died or gave up on this pull. With error handling on, a dead client's
            # endpoint has failed its sends already and is dropped here. Otherwise the sends
            # stay posted: cancelling them would mean closing a working endpoint, which can
            # freeze this loop (see ucx_endpoints).
            log.info("UCX pull %d not delivered: %r", request.request_id, exc)
            self._ucx.endpoints.drop_failed()
            return
        self.bytes_sent += result.reply.total_bytes
        self.blocks_sent += len(result.views)
