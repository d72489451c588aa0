"""The UCX pulling client: requests blocks and receives them straight into the caller's buffers."""

from __future__ import annotations

import asyncio
import time
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
from shared.transfer.wire import (
    MAX_REPLY_BYTES,
    PullRequest,
    Reply,
    Status,
    check_pull,
    decode_reply,
)


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
        inbox: Any = None
        reply: Reply | None = None
        try:
            ep = ucx.endpoints.get(server)
            inbox = ucx.inboxes.take()
            reply = await _exchange(ucx, ep, inbox, request, views, time.monotonic() + timeout)
        except TimeoutError:
            where = _where(lease_id, views)
            raise TransferError(f"{where} timed out after {timeout:g} s") from None
        except Exception as exc:  # ucxx errors: peer gone or unreachable, malformed reply
            gone = " (the server is gone)" if ucx.endpoints.failed(server) else ""
            raise TransferError(f"{_where(lease_id, views)} failed{gone}: {exc!r}") from exc
        finally:
            # Only a pull that got every message back leaves its inbox with nothing posted.
            if inbox is not None and reply is not None:
                ucx.inboxes.give_back(inbox)
            elif inbox is not None:
                ucx.inboxes.cancel(inbox)
            if reply is None:
                ucx.endpoints.drop_failed()  # a dead server's endpoint must not serve again
        assert reply is not None  # the try block either set it or raised
        if reply.status != Status.OK:
            reply.raise_for_status(_where(lease_id, views))
        self.bytes_received += reply.total_bytes
        self.blocks_received += len(views)
        return reply.total_bytes

    async def close(self) -> None:
        # Nothing of its own to release: endpoints belong to the process (see ucx_endpoints).
        return


def _where(lease_id: str, views: list[memoryview]) -> str:
    return f"UCX pull of {len(views)} blocks of lease {lease_id!r}"


async def _exchange(
    ucx: Ucx, ep: Any, inbox: Any, request: PullRequest, views: list[memoryview], until: float
) -> Reply:
    rid = request.request_id
    head = np.empty(MAX_REPLY_BYTES, dtype=np.uint8)
    # Everything is posted before the request leaves, so each message is matched on arrival
    # instead of waiting in UCX's unexpected queue. (Sending first, to post while the server
    # answers, measured slower: a block matched out of that queue starts later.) Blocks come
    # first in the batch because they arrive first: the wait then reads each flag once.
    first = block_tag(rid, 0)  # block i's tag is first | i
    tags: list[tuple[BufferLike, int]] = [(view, first | i) for i, view in enumerate(views)]
    tags.append((head, reply_tag(rid)))
    got = ucx.post_recvs(inbox, tags)
    sent = ucx.post_sends(ep, ((memoryview(request.encode()), REQUEST_TAG),))
    # The receives are posted on the inbox, so a server that dies before its blocks are read
    # fails only its endpoint (on a keepalive round): the wait watches that endpoint too.
    alive = (lambda: ep.alive) if ucx.error_handling else None
    await ucx.progress.wait(sent.requests + got.requests, until=until, alive=alive)
    reply = decode_reply(head.data)
    if reply.request_id != rid:
        raise ValueError(f"reply to request {reply.request_id}, not {rid}")
    # Freeing the completed requests takes a while (each lets go of UCX and ucxx state); on
    # the loop's next turn it overlaps the next pull's wait for its server instead.
    asyncio.get_running_loop().call_soon(_drop, got, sent)
    return reply


def _drop(*_: object) -> None:
    """Does nothing: the handle that calls it holds its arguments until then."""
