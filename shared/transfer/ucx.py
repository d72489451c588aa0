"""The UCX side of the transfer layer: loading ucxx, the tag layout and request posting.

Endpoints are made from worker addresses, with UCX's peer error handling unless
``CRESCENT_UCX_ERROR_HANDLING=off`` (``ucx_settings`` says what each mode sets and why): a peer
that dies fails what was in flight to it, not this process. Worker-address endpoints have no
accept step, so a pull is three kinds of tag messages:

  client -> server  tag REQUEST          a ``wire.PullRequest``; ``reply_to`` = client's address
  server -> client  tag BLOCK|rid|i      the bytes of block i; empty when the reply is an error
  server -> client  tag REPLY|rid        a ``wire.Reply``, after the blocks

The server receives requests on its worker (it has no endpoint to the client yet) and answers
through an endpoint made from ``reply_to``. The client posts every receive before sending the
request, so each block lands in its destination the moment it arrives, and waits for them all
at once. The reply comes last, so nothing delays the first block; the client reads the status
once every message has landed. An error reply's empty blocks complete the receives instead of
leaving them posted, and a pull that times out cancels them (see ``ucx_endpoints``), so nothing
is written after ``pull`` returns. A tag is 64 bits: the top byte names the kind, then a 40-bit
request id unique within the client process, then a block index.

ucxx is imported here only, and only on first use: importing it is slow and it is a large,
optional dependency.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Iterable
from typing import Any

from shared.transfer.base import BufferLike, TransferError
from shared.transfer.ucx_endpoints import Endpoints, Inboxes
from shared.transfer.ucx_progress import Progress
from shared.transfer.ucx_settings import UcxSettings, apply_defaults
from shared.transfer.wire import MAX_BLOCKS_PER_PULL

ADDRESS_PREFIX = b"ucx:"
REQUEST_TAG = 0xC0 << 56
_REPLY_KIND = 0xC1
_BLOCK_KIND = 0xC2
_ID_BITS = 40
_INDEX_BITS = 16
assert MAX_BLOCKS_PER_PULL <= 1 << _INDEX_BITS
_UNAVAILABLE = "the UCX transfer transport cannot work here (set CRESCENT_TRANSFER=tcp): "

# Process-wide, not per client: every client in a process shares the one UCX worker, so ids
# from two clients must not meet on the same tags. A random start keeps a restarted process
# from reusing the ids of replies that may still be in flight to its predecessor's address.
_request_ids = itertools.count(secrets.randbits(_ID_BITS))
_binding: Ucx | None = None


def next_request_id() -> int:
    return next(_request_ids) & ((1 << _ID_BITS) - 1)


def reply_tag(rid: int) -> int:
    return (_REPLY_KIND << 56) | (rid << _INDEX_BITS)


def block_tag(rid: int, index: int) -> int:
    return (_BLOCK_KIND << 56) | (rid << _INDEX_BITS) | index


def worker_address_of(address: bytes) -> bytes:
    """The UCX worker address inside a transfer address; refuses any other kind of address."""
    if not address.startswith(ADDRESS_PREFIX) or len(address) == len(ADDRESS_PREFIX):
        raise TransferError(f"not a UCX transfer address: {address[:16]!r}")
    return address[len(ADDRESS_PREFIX) :]


class Posted:
    """Posted UCX requests, waited on together, and the buffers they read or fill.

    Invariant: holds every buffer for as long as its request is held. A ucxx request does not
    keep its buffer alive, and UCX may touch it well after posting: a send that finds the
    shared-memory queue full copies its bytes only when there is room.
    """

    __slots__ = ("buffers", "progress", "requests")

    def __init__(self, progress: Progress) -> None:
        self.requests: list[Any] = []
        self.buffers: list[Any] = []
        self.progress = progress

    async def wait(self, *, idle: bool = False, until: float | None = None) -> None:
        await self.progress.wait(self.requests, idle=idle, until=until)


class Ucx:
    """The process's UCX: one context, one worker, its progress, and the endpoints every
    server and client of the process share.

    Owns the worker (made here from ucxx's bindings, so that this transport, not ucxx's
    asyncio layer, decides how it progresses) and the endpoint caches.
    Invariant: ``address`` is the worker's address, fixed for the life of the process.
    """

    def __init__(self, api: Any, array: Any, mode: str, *, error_handling: bool) -> None:
        self._api = api
        self._array = array
        self.error_handling = error_handling
        context = api.UCXContext({})
        self.worker = api.UCXWorker(context)
        self._context = context  # the worker needs its context alive
        self.progress = Progress(self.worker, mode)
        self.address = bytes(self.worker.address.tobytes())
        self.endpoints = Endpoints(self._connect)
        self.inboxes = Inboxes(self._connect, self.address)

    def attach(self) -> bytes:
        """Progress UCX on the running loop; returns this process's worker address."""
        self.progress.attach()
        return self.address

    def _connect(self, address: bytes) -> Any:
        remote = self._api.UCXAddress.create_from_buffer(address)
        return self._api.UCXEndpoint.create_from_worker_address(
            self.worker, remote, self.error_handling
        )

    # Posting at the binding level and waiting for a whole batch keeps a single waiter alive
    # while UCX moves every message; ucxx's per-request coroutines would each poll on every
    # loop turn (measured: 10-15% of throughput at 12 blocks).
    def post_sends(self, ep: Any, datas: Iterable[tuple[BufferLike, int]]) -> Posted:
        """Sends each ``(data, tag)`` in order."""
        posted = Posted(self.progress)
        array, tag_of, send = self._array, self._api.UCXXTag, ep.tag_send
        requests, buffers = posted.requests, posted.buffers
        for data, tag in datas:
            buffer = array(data)
            buffers.append(buffer)
            requests.append(send(buffer, tag_of(tag)))
        return posted

    def post_recvs(self, ep: Any, bufs: Iterable[tuple[BufferLike, int]]) -> Posted:
        """Receives into each ``(buffer, tag)``; the buffer takes the message with that tag."""
        posted = Posted(self.progress)
        array, tag_of, recv = self._array, self._api.UCXXTag, ep.tag_recv
        mask = self._api.UCXXTagMaskFull
        requests, buffers = posted.requests, posted.buffers
        for buf, tag in bufs:
            buffer = array(buf)
            buffers.append(buffer)
            requests.append(recv(buffer, tag_of(tag), mask))
        return posted


def load_ucx() -> Ucx:
    """The process's UCX, set up on first use; ``TransferError`` where it cannot work."""
    global _binding
    if _binding is None:
        settings = UcxSettings()
        mode, error_mode = settings.ucx_progress, settings.ucx_error_handling
        # UCX reads its settings when the context is made. Either mode keeps UCX's rendezvous
        # where the client copies each block straight out of the server's memory (CMA):
        # without CMA, blocks go through FIFOs that need both processes on a core at once,
        # and pulls fall to a tenth of TCP's speed once the host is busy.
        apply_defaults(error_mode)
        try:
            import ucxx._lib.libucxx as api
            from ucxx._lib.arr import Array
        except Exception as exc:
            raise TransferError(f"{_UNAVAILABLE}cannot import ucxx ({exc!r})") from exc
        try:
            _binding = Ucx(api, Array, mode, error_handling=error_mode == "peer")
        except Exception as exc:
            raise TransferError(f"{_UNAVAILABLE}cannot start a UCX worker ({exc!r})") from exc
    return _binding
