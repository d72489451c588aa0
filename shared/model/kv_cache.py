"""The paged KV tensor: every block slot of a node's pool, in one preallocated torch tensor."""

from __future__ import annotations

import math

import numpy as np
import torch

from shared.kv.layout import KVLayout

_TORCH_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn,
}
# The largest finite float8_e4m3fn. Values are stored unscaled (a scale of 1, as vLLM uses
# where no scales were calibrated), so K and V beyond it saturate to it.
FP8_E4M3_MAX = float(torch.finfo(torch.float8_e4m3fn).max)


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a KV dtype name such as ``"float32"``."""
    try:
        return _TORCH_DTYPES[name]
    except KeyError:
        raise ValueError(
            f"unknown dtype {name!r}; expected one of {sorted(_TORCH_DTYPES)}"
        ) from None


def to_stored(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` as a cache of ``dtype`` holds it: rounded to nearest even, and for fp8 first
    clamped to its range, so that an outlier saturates instead of becoming NaN (not every
    torch's conversion saturates; the fused step's does, to the same bytes)."""
    if dtype == torch.float8_e4m3fn:
        x = x.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    return x.to(dtype)


def stores_bytes(dtype: torch.dtype) -> bool:
    """Whether indexed writes into a cache of ``dtype`` go through a uint8 view of it: torch
    has no ``index_copy_`` for the float8 types on the CPU, and copying bytes is the same."""
    return dtype.itemsize == 1


class PagedKVCache:
    """Owns the storage of ``num_blocks`` KV blocks laid out as ``KVLayout`` describes.

    Shape ``[num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim]``: each block's
    bytes are contiguous, so a block moves between nodes and tiers as one buffer, while a
    layer's K (or V) over a run of blocks gathers into ``[tokens, heads, dim]`` with one copy.
    Block ids are the ids of the ``BlockPool`` that decides which slots are in use.
    """

    def __init__(self, layout: KVLayout, num_blocks: int, device: torch.device | str = "cpu"):
        self.layout = layout
        self.num_blocks = num_blocks
        self.tensor = _zeros((num_blocks, *layout.block_shape), torch_dtype(layout.dtype), device)
        # The same storage as rows of one token's K (or V) heads for one layer.
        self.rows = self.tensor.view(-1, layout.num_kv_heads * layout.head_dim)
        self.block_row_stride = layout.num_layers * 2 * layout.block_size
        # ... and as chunks: one block's tokens of one layer's K (or V), contiguous.
        self.chunks = self.tensor.view(num_blocks * layout.num_layers * 2, -1)

    def token_rows(self, block_ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Layer-0 K rows of the tokens at ``offsets`` inside ``block_ids`` (same shapes)."""
        return block_ids * self.block_row_stride + offsets

    def block_chunks(self, block_ids: torch.Tensor) -> torch.Tensor:
        """Layer-0 K chunks of ``block_ids`` (same shape)."""
        return block_ids * (self.layout.num_layers * 2)

    def layer_chunk_offsets(self, layer: int) -> tuple[int, int]:
        """What to add to a layer-0 K chunk to reach the same block's K and V in ``layer``."""
        return 2 * layer, 2 * layer + 1

    def rows_by_layer(self, rows: torch.Tensor) -> torch.Tensor:
        """Layer-0 K rows ``[T]`` -> every layer's K and V rows ``[layers, 2, T]``, in one op
        per step instead of two per layer."""
        n = self.layout.num_layers
        offsets = torch.arange(2 * n, device=rows.device).view(n, 2, 1) * self.layout.block_size
        return rows.view(1, 1, -1) + offsets

    def chunks_by_layer(self, chunks: torch.Tensor) -> torch.Tensor:
        """Layer-0 K chunk ids (any shape, flattened) -> ``[layers, 2, N]`` for K and V."""
        n = self.layout.num_layers
        offsets = torch.arange(2 * n, device=chunks.device).view(n, 2, 1)
        return chunks.reshape(1, 1, -1) + offsets

    def block(self, block_id: int) -> torch.Tensor:
        """The contiguous storage of one block (a view; writes go to the cache)."""
        return self.tensor[block_id]

    def copy_block(self, src: int, dst: int) -> None:
        """Copies every layer's K and V of block ``src`` into block ``dst``."""
        self.tensor[dst].copy_(self.tensor[src])

    def block_buffer(self, block_id: int) -> np.ndarray:
        """A writable uint8 numpy view of one block's bytes (CPU caches only), so transfers
        send from and receive into the pool without a copy."""
        return self.block(block_id).view(torch.uint8).view(-1).numpy()

    def read_block_bytes(self, block_id: int) -> bytes:
        """A copy of one block's bytes, e.g. to ship to a peer or a lower tier."""
        return self.block(block_id).cpu().view(torch.uint8).numpy().tobytes()

    def write_block_bytes(self, block_id: int, data: bytes | bytearray | memoryview) -> None:
        """Fills one block from bytes produced by ``read_block_bytes`` of the same layout."""
        if len(data) != self.layout.block_bytes:
            raise ValueError(
                f"block payload is {len(data)} bytes, expected {self.layout.block_bytes}"
            )
        src = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        self.block(block_id).view(torch.uint8).view(-1).copy_(src)


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """Zero-filled storage. On the CPU it comes from calloc, so pages are only touched (and
    paid for) when a block is first written, instead of all at start-up."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    raw = torch.from_numpy(np.zeros(nbytes, dtype=np.uint8))
    return raw.view(dtype).view(shape)
