"""The bytes of a pull, shared by every transport, and the server's answer to one.

A pull is one request (the lease, the block ids and the byte size the client expects for each,
plus, for UCX, the worker address to answer to), one reply header (a status,
and a message on error), then the raw bytes of every block in order. The client states the sizes
up front so the server refuses a mismatch before sending anything: no transport ever has to drain
or truncate.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from shared.transfer.base import BlockProvider, BufferLike, TransferError

MAGIC = b"CKVT"
VERSION = 1
MAX_BLOCKS_PER_PULL = 8192
MAX_LEASE_BYTES = 1024
MAX_REPLY_TO_BYTES = 8192
MAX_MESSAGE_BYTES = 1024

# magic, version, lease length, request id, reply-to length, block count
_REQUEST_HEAD = struct.Struct("<4sHHQHI")
# magic, version, status, request id, total block bytes, message length
_REPLY_HEAD = struct.Struct("<4sHHQQI")
REQUEST_HEAD_BYTES = _REQUEST_HEAD.size
REPLY_HEAD_BYTES = _REPLY_HEAD.size
MAX_REQUEST_BYTES = (
    REQUEST_HEAD_BYTES + MAX_LEASE_BYTES + MAX_REPLY_TO_BYTES + 16 * MAX_BLOCKS_PER_PULL
)
MAX_REPLY_BYTES = REPLY_HEAD_BYTES + MAX_MESSAGE_BYTES


class Status(IntEnum):
    OK = 0
    UNKNOWN_LEASE = 1
    SIZE_MISMATCH = 2
    BAD_REQUEST = 3
    INTERNAL = 4


@dataclass(frozen=True, slots=True)
class PullRequest:
    """One pull as it travels. Invariant: ``sizes`` has one entry per block id."""

    request_id: int
    lease_id: str
    block_ids: tuple[int, ...]
    sizes: tuple[int, ...]
    reply_to: bytes = b""

    def encode(self) -> bytes:
        lease = self.lease_id.encode("utf-8")
        n = len(self.block_ids)
        head = _REQUEST_HEAD.pack(
            MAGIC, VERSION, len(lease), self.request_id, len(self.reply_to), n
        )
        ids = struct.pack(f"<{n}Q", *self.block_ids)
        sizes = struct.pack(f"<{n}Q", *self.sizes)
        return b"".join((head, lease, ids, sizes, self.reply_to))


def request_body_bytes(head: bytes | memoryview) -> int:
    """How many bytes follow a request head; raises ``ValueError`` on a malformed one."""
    return _request_body_bytes(_REQUEST_HEAD.unpack_from(head))


def _request_body_bytes(fields: tuple[bytes, int, int, int, int, int]) -> int:
    magic, version, lease_len, _, reply_len, n = fields
    if magic != MAGIC or version != VERSION:
        raise ValueError(f"not a version-{VERSION} pull request")
    if n > MAX_BLOCKS_PER_PULL or lease_len > MAX_LEASE_BYTES or reply_len > MAX_REPLY_TO_BYTES:
        raise ValueError("pull request over the protocol limits")
    return int(lease_len + 16 * n + reply_len)


def decode_request(message: bytes | memoryview) -> PullRequest:
    """The request at the start of ``message`` (trailing bytes are ignored)."""
    view = memoryview(message).cast("B")
    fields = _REQUEST_HEAD.unpack_from(view)
    if len(view) < REQUEST_HEAD_BYTES + _request_body_bytes(fields):
        raise ValueError("truncated pull request")
    _, _, lease_len, request_id, reply_len, n = fields
    at = REQUEST_HEAD_BYTES
    lease = str(view[at : at + lease_len], "utf-8")
    at += lease_len
    # Ids and sizes in one unpack: a server decodes a request on every pull's critical path.
    numbers = struct.unpack_from(f"<{2 * n}Q", view, at)
    at += 16 * n
    reply_to = bytes(view[at : at + reply_len])
    return PullRequest(request_id, lease, numbers[:n], numbers[n:], reply_to)


@dataclass(frozen=True, slots=True)
class Reply:
    """The header that answers a pull. Invariant: ``message`` is empty when ``status`` is OK."""

    request_id: int
    status: Status
    total_bytes: int = 0
    message: str = ""

    def encode(self) -> bytes:
        text = self.message.encode("utf-8")[:MAX_MESSAGE_BYTES]
        head = _REPLY_HEAD.pack(
            MAGIC, VERSION, self.status, self.request_id, self.total_bytes, len(text)
        )
        return head + text

    def raise_for_status(self, where: str) -> None:
        if self.status != Status.OK:
            raise TransferError(f"{where}: {self.status.name.lower()}: {self.message}")


def reply_message_bytes(head: bytes | memoryview) -> int:
    """How many message bytes follow a reply head; raises ``ValueError`` on a malformed one."""
    return _reply_message_bytes(_REPLY_HEAD.unpack_from(head))


def _reply_message_bytes(fields: tuple[bytes, int, int, int, int, int]) -> int:
    magic, version, _, _, _, message_len = fields
    if magic != MAGIC or version != VERSION or message_len > MAX_MESSAGE_BYTES:
        raise ValueError("not a valid pull reply")
    return int(message_len)


def decode_reply(message: bytes | memoryview) -> Reply:
    view = memoryview(message).cast("B")
    fields = _REPLY_HEAD.unpack_from(view)
    message_len = _reply_message_bytes(fields)
    _, _, status, request_id, total, _ = fields
    try:
        code = Status(status)
    except ValueError as exc:
        raise ValueError(f"unknown reply status {status}") from exc
    if not message_len:  # every successful pull: no message to decode
        return Reply(request_id, code, total)
    text = bytes(view[REPLY_HEAD_BYTES : REPLY_HEAD_BYTES + message_len])
    return Reply(request_id, code, total, text.decode("utf-8", errors="replace"))


def byte_view(buf: BufferLike, *, writable: bool) -> memoryview:
    """A flat byte view of ``buf`` without copying; refuses what cannot be sent or filled."""
    try:
        view = (buf.data if isinstance(buf, np.ndarray) else memoryview(buf)).cast("B")
    except TypeError as exc:
        raise TransferError(f"buffer is not contiguous bytes: {exc}") from exc
    if writable and view.readonly:
        raise TransferError("destination buffer is read-only")
    return view


def check_pull(
    lease_id: str, block_ids: Sequence[int], dest: Sequence[BufferLike]
) -> list[memoryview]:
    """The destination views of a well-formed pull; raises ``TransferError`` before any I/O."""
    if len(block_ids) != len(dest):
        raise TransferError(f"{len(block_ids)} block ids but {len(dest)} destination buffers")
    if len(block_ids) > MAX_BLOCKS_PER_PULL:
        raise TransferError(f"at most {MAX_BLOCKS_PER_PULL} blocks per pull")
    if len(lease_id.encode("utf-8")) > MAX_LEASE_BYTES:
        raise TransferError(f"lease id longer than {MAX_LEASE_BYTES} bytes")
    if any(b < 0 for b in block_ids):
        raise TransferError("block ids must be non-negative")
    return [byte_view(d, writable=True) for d in dest]


@dataclass(frozen=True, slots=True)
class Answer:
    """What a server sends back for one request. Invariant: ``views`` is empty unless OK."""

    reply: Reply
    views: tuple[memoryview, ...] = ()


def answer(provider: BlockProvider, request: PullRequest) -> Answer:
    """Look the blocks up and check them against the sizes the client expects."""
    rid = request.request_id

    def refuse(status: Status, message: str) -> Answer:
        return Answer(Reply(rid, status, 0, message))

    try:
        buffers = provider(request.lease_id, request.block_ids)
    except Exception as exc:  # a provider bug must cost one pull, not the server
        return refuse(Status.INTERNAL, f"block provider failed: {exc!r}")
    if buffers is None:
        return refuse(Status.UNKNOWN_LEASE, f"lease {request.lease_id!r} is unknown or expired")
    if len(buffers) != len(request.block_ids):
        return refuse(
            Status.INTERNAL, f"provider gave {len(buffers)} buffers for {len(request.block_ids)}"
        )
    try:
        views = tuple([byte_view(b, writable=False) for b in buffers])
    except TransferError as exc:
        return refuse(Status.INTERNAL, str(exc))
    for block_id, view, want in zip(request.block_ids, views, request.sizes, strict=True):
        if view.nbytes != want:
            return refuse(
                Status.SIZE_MISMATCH,
                f"block {block_id} has {view.nbytes} bytes, destination has {want}",
            )
    return Answer(Reply(rid, Status.OK, sum(request.sizes)), views)  # sizes checked equal
