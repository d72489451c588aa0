"""Moving KV block bytes between nodes: a pull-based server/client pair over UCX or TCP."""

from shared.transfer.base import (
    BlockProvider,
    BufferLike,
    TransferClient,
    TransferError,
    TransferServer,
    create_client,
    create_server,
)

__all__ = [
    "BlockProvider",
    "BufferLike",
    "TransferClient",
    "TransferError",
    "TransferServer",
    "create_client",
    "create_server",
]
