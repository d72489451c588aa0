"""The KV transfer seam: what a block server and a pulling client promise, and how to get one.

A prefill node runs a ``TransferServer`` that hands out finished blocks held under a lease; a
decode node (or a peer prefill node) runs a ``TransferClient`` that pulls them straight into its
own pool. The layer moves bytes only: it knows nothing of tensors or checksums, which callers
verify with ``shared.kv.checksum.BlockChecksum``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from shared.errors import CrescentError

BufferLike = memoryview | np.ndarray
BlockProvider = Callable[[str, Sequence[int]], Sequence[BufferLike] | None]
"""Given ``(lease_id, block_ids)``, the buffers to send in that order, or None for an unknown or
expired lease. It runs on the server's event loop, so it must only look things up, not wait."""

KINDS = ("ucx", "tcp")
DEFAULT_TIMEOUT_S = 10.0
# A client that stops reading must not pin a server's send forever; generous, because a
# healthy pull of a whole long sequence still finishes far below it.
DEFAULT_SEND_TIMEOUT_S = 30.0


class TransferError(CrescentError):
    """A pull failed: unknown lease, size mismatch, peer gone, timeout or a malformed exchange.

    The destination buffers of a failed pull hold unspecified bytes, but nothing writes to them
    after the error has been raised.
    """


class TransferServer(Protocol):
    """Serves block pulls from a ``BlockProvider``.

    Owns its endpoint (socket or UCX worker tag) and the tasks answering pulls.
    Invariant: ``address`` is valid from ``start()`` until ``close()``, and the counters only grow.
    """

    @property
    def address(self) -> bytes:
        """Opaque bytes a client passes to ``pull``; published to peers over the bus."""
        ...

    @property
    def bytes_sent(self) -> int:
        """Block bytes handed to clients by completed pulls."""
        ...

    @property
    def blocks_sent(self) -> int:
        """Blocks handed to clients by completed pulls."""
        ...

    async def start(self) -> None:
        """Begin serving; raises ``TransferError`` when the transport cannot work here."""
        ...

    async def close(self) -> None:
        """Stop serving and drop every connection; pulls in flight fail on the client side."""
        ...


class TransferClient(Protocol):
    """Pulls blocks from servers into caller-owned buffers.

    Owns the connections it keeps to servers between pulls.
    Invariant: a pull either fills every destination and returns, or raises ``TransferError``
    within about ``timeout_s``; it never hangs and never writes after returning.
    """

    @property
    def bytes_received(self) -> int:
        """Block bytes received by completed pulls."""
        ...

    @property
    def blocks_received(self) -> int:
        """Blocks received by completed pulls."""
        ...

    async def pull(
        self,
        address: bytes,
        lease_id: str,
        block_ids: Sequence[int],
        dest: Sequence[BufferLike],
        timeout_s: float | None = None,
    ) -> int:
        """Fill ``dest[i]`` with block ``block_ids[i]`` of ``lease_id``; returns bytes received.

        ``timeout_s`` bounds the whole pull (None: the client's default).
        """
        ...

    async def close(self) -> None:
        """Drop every connection; the client must not be used afterwards."""
        ...


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise TransferError(f"unknown transfer kind {kind!r}; expected one of {', '.join(KINDS)}")
    return kind


def create_server(
    kind: str,
    provider: BlockProvider,
    host: str = "127.0.0.1",
    *,
    send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S,
) -> TransferServer:
    """A server of ``kind`` ("ucx" or "tcp"), not yet started.

    ``host`` is the interface a TCP server binds; a UCX server is reached through its worker
    address instead (``UCX_NET_DEVICES`` chooses its interfaces). For "ucx" this raises
    ``TransferError`` when ucxx cannot be imported here, so a caller can fall back to "tcp".
    """
    if check_kind(kind) == "tcp":
        from shared.transfer.tcp import TcpTransferServer

        return TcpTransferServer(provider, host, send_timeout_s=send_timeout_s)
    from shared.transfer.ucx_server import UcxTransferServer

    return UcxTransferServer(provider, send_timeout_s=send_timeout_s)


def create_client(kind: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> TransferClient:
    """A client of ``kind`` whose pulls time out after ``timeout_s`` unless told otherwise."""
    if check_kind(kind) == "tcp":
        from shared.transfer.tcp_client import TcpTransferClient

        return TcpTransferClient(timeout_s=timeout_s)
    from shared.transfer.ucx_client import UcxTransferClient

    return UcxTransferClient(timeout_s=timeout_s)
