"""The UCX side of the transfer layer: loading ucxx, the tag layout and request posting.

Endpoints are made from worker addresses with error handling off because that is what lets UCX
choose shared memory within a host; listener endpoints always turn error handling on, which pins
UCX to TCP even between two processes of one host. Worker-address endpoints have no accept step,
so a pull is three kinds of tag messages:

  client -> server  tag REQUEST          a ``wire.PullRequest``; ``reply_to`` = client's address
  server -> client  tag REPLY|rid        a ``wire.Reply``
  server -> client  tag BLOCK|rid|i      the bytes of block i; empty when the reply is an error

The server receives requests on its worker (it has no endpoint to the client yet) and answers
through an endpoint made from ``reply_to``. The client posts every receive before sending the
request, so each block lands in its destination the moment it arrives; an error reply completes
those receives with empty messages instead of leaving them posted, and a pull that times out
cancels them (see ``ucx_endpoints``), so nothing is written after ``pull`` returns. A tag is 64
bits: the top byte names the kind, then a 40-bit request id unique within the client process,
then a block index.

ucxx is imported here only, and only on first use: importing it is slow and it is a large,
optional dependency.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shared.transfer.base import BufferLike, TransferError
from shared.transfer.ucx_endpoints import Endpoints, Inboxes
from shared.transfer.wire import MAX_BLOCKS_PER_PULL

ADDRESS_PREFIX = b"ucx:"
REQUEST_TAG = 0xC0 << 56
_REPLY_KIND = 0xC1
_BLOCK_KIND = 0xC2
_ID_BITS = 40
_INDEX_BITS = 16
assert MAX_BLOCKS_PER_PULL <= 1 << _INDEX_BITS
_SPIN_S = 0.002
_FIRST_BACKOFF_S = 50e-6
_MAX_BACKOFF_S = 0.002
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


@dataclass(frozen=True, slots=True)
class Posted:
    """A posted UCX request and the buffer it reads or fills.

    Invariant: holds the buffer for as long as the request is held. A ucxx request does not
    keep its buffer alive, and UCX may touch it well after posting: a send that finds the
    shared-memory queue full copies its bytes only when there is room.
    """

    request: Any
    buffer: Any

    async def wait(self) -> None:
        # ucxx's own wait re-checks on every loop turn, so a receive that waits for the next
        # request keeps a core busy forever. Spin only briefly (blocks arrive back to back),
        # then back off: the loop sleeps in epoll, woken by UCX's event fd when data comes.
        request = self.request
        spin_until = time.monotonic() + _SPIN_S
        delay = 0.0
        while not request.completed:
            await asyncio.sleep(delay)
            if time.monotonic() > spin_until:
                delay = min(max(2 * delay, _FIRST_BACKOFF_S), _MAX_BACKOFF_S)
        request.check_error()


class Ucx:
    """The process's ucxx: the module, the request-level calls this transport makes, and the
    endpoints every server and client of the process share.

    Owns the endpoint caches; the UCX context and worker are ucxx's, one per process.
    Invariant: ``address`` and ``inboxes`` are set once ``attach`` has succeeded.
    """

    def __init__(self, module: Any, api: Any, array: Any) -> None:
        self.module = module
        self._api = api
        self._array = array
        self.address = b""
        self.endpoints = Endpoints(module)
        self._inboxes: Inboxes | None = None

    @property
    def inboxes(self) -> Inboxes:
        assert self._inboxes is not None, "attach() first"
        return self._inboxes

    def attach(self) -> bytes:
        """Progress UCX on the running loop; returns this process's worker address."""
        try:
            # The context must come to life inside a running loop, or ucxx binds its progress
            # task to a loop that never runs; each new loop needs its own progress task too.
            self.module.continuous_ucx_progress()
            if not self.address:
                self.address = bytes(self.module.get_worker_address().tobytes())
                self._inboxes = Inboxes(self.module, self.address)
        except Exception as exc:
            raise TransferError(f"{_UNAVAILABLE}cannot start a UCX worker ({exc!r})") from exc
        return self.address

    # The async Endpoint.send/recv of ucxx wrap each request in a coroutine that polls it on
    # every loop turn; with one per block the loop spends more time polling than UCX spends
    # copying (measured: 10-15% of throughput at 12 blocks). Posting at the binding level and
    # awaiting the requests in order keeps a single waiter alive while UCX moves them all.
    def post_send(self, ep: Any, data: BufferLike, tag: int) -> Posted:
        array = self._array(data)
        return Posted(self._raw(ep).tag_send(array, self._api.UCXXTag(tag)), array)

    def post_recv(self, ep: Any, buf: BufferLike, tag: int) -> Posted:
        array = self._array(buf)
        tag_obj = self._api.UCXXTag(tag)
        return Posted(self._raw(ep).tag_recv(array, tag_obj, self._api.UCXXTagMaskFull), array)

    @staticmethod
    async def wait_all(posted: Sequence[Posted]) -> None:
        for one in posted:
            await one.wait()

    @staticmethod
    def _raw(ep: Any) -> Any:
        raw = ep._ep
        if raw is None:
            raise ConnectionError("UCX endpoint already closed")
        return raw


def load_ucx() -> Ucx:
    """The process's ucxx binding, imported on first use; ``TransferError`` where it cannot."""
    global _binding
    if _binding is None:
        # ucxx reads these once, when its context is created. Progress runs in ucxx's thread,
        # which sleeps while idle. Polling progress pulls ~2.5x faster (bench/transfer.py) but
        # keeps a core busy for as long as the process lives, idle or not: on a small host
        # running several nodes that starves the engines. Set UCXPY_PROGRESS_MODE=polling
        # where cores are spare. Shared memory keeps UCX's default protocol, where the client
        # copies each block straight out of the server's memory (CMA): without CMA, blocks go
        # through FIFOs that need both processes on a core at once, and pulls fall to a tenth
        # of TCP's speed once the host is busy.
        os.environ.setdefault("UCXPY_PROGRESS_MODE", "thread")
        os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
        try:
            import ucxx
            import ucxx._lib.libucxx as api
            from ucxx._lib.arr import Array
        except Exception as exc:
            raise TransferError(f"{_UNAVAILABLE}cannot import ucxx ({exc!r})") from exc
        _binding = Ucx(ucxx, api, Array)
    return _binding
