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
those receives with empty messages instead of leaving them posted. A tag is 64 bits: the top byte
names the kind, then a 40-bit request id unique within the client process, then a block index.

ucxx is imported here only, and only on first use: importing it is slow and it is a large,
optional dependency.
"""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import Sequence
from typing import Any

from shared.transfer.base import BufferLike, TransferError
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


class Ucx:
    """The process's ucxx: the module and the request-level calls this transport makes.

    Owns nothing beyond references to ucxx; the UCX context and worker are ucxx's, one per
    process. Invariant: ``address`` is the worker address once ``attach`` has succeeded.
    """

    def __init__(self, module: Any, api: Any, array: Any) -> None:
        self.module = module
        self._api = api
        self._array = array
        self.address = b""

    def attach(self) -> bytes:
        """Progress UCX on the running loop; returns this process's worker address."""
        try:
            # The context must come to life inside a running loop, or ucxx binds its progress
            # task to a loop that never runs; each new loop needs its own progress task too.
            self.module.continuous_ucx_progress()
            if not self.address:
                self.address = bytes(self.module.get_worker_address().tobytes())
        except Exception as exc:
            raise TransferError(f"{_UNAVAILABLE}cannot start a UCX worker ({exc!r})") from exc
        return self.address

    # The async Endpoint.send/recv of ucxx wrap each request in a coroutine that polls it on
    # every loop turn; with one per block the loop spends more time polling than UCX spends
    # copying (measured: 10-15% of throughput at 12 blocks). Posting at the binding level and
    # awaiting the requests in order keeps a single waiter alive while UCX moves them all.
    def post_send(self, ep: Any, data: BufferLike, tag: int) -> Any:
        return self._raw(ep).tag_send(self._array(data), self._api.UCXXTag(tag))

    def post_recv(self, ep: Any, buf: BufferLike, tag: int) -> Any:
        tag_obj = self._api.UCXXTag(tag)
        return self._raw(ep).tag_recv(self._array(buf), tag_obj, self._api.UCXXTagMaskFull)

    @staticmethod
    async def wait_all(requests: Sequence[Any]) -> None:
        for request in requests:
            await request.wait()

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
        # ucxx reads these once, when its context is created. Polling progress: the default
        # progress thread fights the event loop for the GIL and halves throughput on 2 cores.
        os.environ.setdefault("UCXPY_PROGRESS_MODE", "polling")
        os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
        try:
            import ucxx
            import ucxx._lib.libucxx as api
            from ucxx._lib.arr import Array
        except Exception as exc:
            raise TransferError(f"{_UNAVAILABLE}cannot import ucxx ({exc!r})") from exc
        _binding = Ucx(ucxx, api, Array)
    return _binding
