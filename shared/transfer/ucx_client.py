"""The UCX pulling client: requests blocks and receives them straight into the caller's buffers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np

from shared.transfer.base import DEFAULT_TIMEOUT_S, BufferLike, TransferError
from shared.transfer.ucx import (
    REQUEST_TAG,
    Ucx,
    block_tag,
    load_ucx,
    next_request_id,
    reply_tag,
    worker_address_of,
)
from shared.transfer.wire import MAX_REPLY_BYTES, PullRequest, Reply, check_pull, decode_reply


class UcxTransferClient:
    """Pulls blocks over UCX into caller-owned buffers.

    Owns its counters; endpoints are the process's (``Ucx.endpoints``), like the UCX worker.
    Invariant: no receive stays posted for a pull that has returned: a pull that fails closes
    the inbox its receives were posted through, which cancels them and nothing else.
    """

    def __init__(self, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self._ucx = load_ucx()
        self._timeout_s = timeout_s
        self.bytes_received = 0
        self.blocks_received = 0

    async def pull(
        self,
        address: bytes,
        lease_id: str,
        block_ids: Sequence[int],
        dest: Sequence[BufferLike],
        timeout_s: float | None = None,
    ) -> int:
        views = check_pull(lease_id, block_ids, dest)
        server = worker_address_of(address)
        ucx = self._ucx
        sizes = tuple(v.nbytes for v in views)
        request = PullRequest(next_request_id(), lease_id, tuple(block_ids), sizes, ucx.attach())
        timeout = self._timeout_s if timeout_s is None else timeout_s
        where = f"UCX pull of {len(views)} blocks of lease {lease_id!r}"
        inbox: Any = None
        reply: Reply | None = None
        try:
            async with asyncio.timeout(timeout):
                ep = ucx.endpoints.get(server)
                inbox = ucx.inboxes.take()
                reply = await _exchange(ucx, ep, inbox, request, views)
        except TimeoutError:
            raise TransferError(f"{where} timed out after {timeout:g} s") from None
        except Exception as exc:  # ucxx errors: peer unreachable, malformed reply
            raise TransferError(f"{where} failed: {exc!r}") from exc
        finally:
            # Only a pull that got every message back leaves its inbox with nothing posted.
            if inbox is not None and reply is not None:
                ucx.inboxes.give_back(inbox)
            elif inbox is not None:
                ucx.inboxes.cancel(inbox)
        assert reply is not None  # the try block either set it or raised
        reply.raise_for_status(where)
        self.bytes_received += reply.total_bytes
        self.blocks_received += len(views)
        return reply.total_bytes

    async def close(self) -> None:
        # Nothing of its own to release: endpoints belong to the process (see ucx_endpoints).
        return


async def _exchange(
    ucx: Ucx, ep: Any, inbox: Any, request: PullRequest, views: list[memoryview]
) -> Reply:
    rid = request.request_id
    head = np.empty(MAX_REPLY_BYTES, dtype=np.uint8)
    # Everything is posted before the request leaves, so each message is matched on arrival
    # instead of waiting in UCX's unexpected queue. (Sending first, to post while the server
    # answers, measured slower: a block matched out of that queue starts later.)
    got_reply = ucx.post_recv(inbox, head, reply_tag(rid))
    got_blocks = [ucx.post_recv(inbox, v, block_tag(rid, i)) for i, v in enumerate(views)]
    await ucx.post_send(ep, memoryview(request.encode()), REQUEST_TAG).wait()
    await got_reply.wait()
    reply = decode_reply(head.data)
    if reply.request_id != rid:
        raise ValueError(f"reply to request {reply.request_id}, not {rid}")
    await ucx.wait_all(got_blocks)
    return reply
