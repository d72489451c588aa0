"""The UCX pulling client: requests blocks and receives them straight into the caller's buffers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

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
from shared.transfer.ucx_endpoints import Endpoints, Peer
from shared.transfer.wire import MAX_REPLY_BYTES, PullRequest, Reply, check_pull, decode_reply

# Shared by every client in the process, like the worker: endpoint epochs are per pair of
# workers, so two clients keeping their own endpoints to one server would break each other's.
_endpoints: Endpoints | None = None


class UcxTransferClient:
    """Pulls blocks over UCX into caller-owned buffers.

    Owns its counters; endpoints to servers are process-wide, like the UCX worker.
    Invariant: no receive stays posted for a pull that has returned: a pull that fails aborts
    its endpoint, which cancels them (and fails the other pulls in flight to that server, which
    is then presumed gone or stalled).
    """

    def __init__(self, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        global _endpoints
        self._ucx = load_ucx()
        self._timeout_s = timeout_s
        if _endpoints is None:
            _endpoints = Endpoints(self._ucx.module, own_epochs=True)
        self._endpoints = _endpoints
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
        reply_to = self._ucx.attach()
        sizes = tuple(v.nbytes for v in views)
        timeout = self._timeout_s if timeout_s is None else timeout_s
        where = f"UCX pull of {len(views)} blocks of lease {lease_id!r}"
        peer: Peer | None = None
        try:
            async with asyncio.timeout(timeout):
                peer = await self._endpoints.acquire(server)
                request = PullRequest(
                    next_request_id(), lease_id, tuple(block_ids), sizes, reply_to, peer.epoch
                )
                reply = await _exchange(self._ucx, peer, request, views)
        except TimeoutError:
            self._give_up(server, peer)
            raise TransferError(f"{where} timed out after {timeout:g} s") from None
        except Exception as exc:  # ucxx errors: peer unreachable, endpoint closed, bad reply
            self._give_up(server, peer)
            raise TransferError(f"{where} failed: {exc!r}") from exc
        finally:
            if peer is not None:
                self._endpoints.release(peer)
        reply.raise_for_status(where)
        self.bytes_received += reply.total_bytes
        self.blocks_received += len(views)
        return reply.total_bytes

    async def close(self) -> None:
        # Endpoints stay for the other clients of the process; aborting a healthy one would
        # only make its server rebuild the endpoint back.
        return

    def _give_up(self, server: bytes, peer: Peer | None) -> None:
        if peer is not None:
            self._endpoints.retire(server, peer, now=True)


async def _exchange(ucx: Ucx, peer: Peer, request: PullRequest, views: list[memoryview]) -> Reply:
    rid = request.request_id
    head = np.empty(MAX_REPLY_BYTES, dtype=np.uint8)
    # Everything is posted before the request leaves, so each message is matched on arrival
    # instead of waiting in UCX's unexpected queue for this task to get a turn.
    got_reply = ucx.post_recv(peer.ep, head, reply_tag(rid))
    got_blocks = [ucx.post_recv(peer.ep, v, block_tag(rid, i)) for i, v in enumerate(views)]
    await ucx.post_send(peer.ep, memoryview(request.encode()), REQUEST_TAG).wait()
    await got_reply.wait()
    reply = decode_reply(head.data)
    if reply.request_id != rid:
        raise ValueError(f"reply to request {reply.request_id}, not {rid}")
    await ucx.wait_all(got_blocks)
    return reply
