"""Weights in a file's own ggml blocks (a GGUF's, or a bf16/fp16 safetensors shard's), for the
CPU kernels.

A projection with blocks multiplies its inputs with ``torch.ops.crescent.ggml_matmul``, which
reads the blocks as the file stores them, whatever their type (``cpu_kernels/ggml_formats.h``):
few rows in registers, many rows a few MB of expanded weight rows at a time through torch's
BLAS. A projection that also has an fp32 copy (one built that way, as the tests do) keeps
using it, with torch's BLAS, for more than ``MAX_ROWS`` rows. Both multiply by the same weight
values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# Up to this many rows the kernels beat torch's BLAS on the fp32 weights, as measured by
# bench/ggml_gemm.py (a whole step's projections at 1 to 64 rows; even at 32 rows).
MAX_ROWS = 24


@dataclass(frozen=True, slots=True)
class GgmlBlocks:
    """One weight matrix ``[out, in]`` as the file stores it: ``blocks`` is uint8
    ``[out, in / block weights * block bytes]`` of ggml type ``qtype``. ``rope_heads``: when
    not 0, the rows are in llama.cpp's interleaved rope order for that many heads (Llama's Q
    and K). Invariant: the shapes agree."""

    blocks: torch.Tensor
    qtype: int
    in_features: int
    rope_heads: int = 0

    @property
    def out_features(self) -> int:
        return int(self.blocks.shape[0])


class GgmlWeight:
    """A projection read from ggml blocks, callable as ``x @ W.T`` for ``x`` of ``[M, in]``
    float32: one or more parts stacked by output rows (Q, K and V, or gate and up, as the file
    keeps them), each in its own type. ``gather``, when set, is the output column each
    Hugging Face column is read from (Q and K rows kept in llama.cpp's order).

    Owns references to the blocks only: no copy, no other layout. Invariant: the parts share
    ``in_features``, and ``gather`` is a permutation of the outputs.
    """

    __slots__ = ("gather", "in_features", "out_features", "parts")

    def __init__(self, parts: GgmlBlocks | Sequence[GgmlBlocks]) -> None:
        self.parts = [parts] if isinstance(parts, GgmlBlocks) else list(parts)
        widths = {p.in_features for p in self.parts}
        if len(widths) != 1:
            raise ValueError(f"the parts of a projection take different widths {sorted(widths)}")
        self.in_features = widths.pop()
        self.out_features = sum(p.out_features for p in self.parts)
        self.gather = _gather(self.parts)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.stride(-1) != 1:
            x = x.contiguous()
        k = self.in_features
        outs = [torch.ops.crescent.ggml_matmul(x, p.blocks, p.qtype, k) for p in self.parts]
        y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        return y if self.gather is None else y.index_select(1, self.gather)

    def dequantize(self) -> torch.Tensor:
        """The fp32 ``[out, in]`` weights the kernel multiplies by, in Hugging Face row
        order."""
        k = self.in_features
        rows = [torch.ops.crescent.ggml_expand(p.blocks, p.qtype, k) for p in self.parts]
        w = torch.cat(rows) if len(rows) > 1 else rows[0]
        return w if self.gather is None else w.index_select(0, self.gather)


def _gather(parts: Sequence[GgmlBlocks]) -> torch.Tensor | None:
    """The stored output column of each Hugging Face column, or None when they agree."""
    if not any(p.rope_heads for p in parts):
        return None
    orders, start = [], 0
    for p in parts:
        local = hf_row_order(p) if p.rope_heads else torch.arange(p.out_features)
        orders.append(local + start)
        start += p.out_features
    return torch.cat(orders)


def hf_row_order(weight: GgmlBlocks) -> torch.Tensor:
    """For a weight whose rows llama.cpp interleaved for rope: which stored row each Hugging
    Face row is (within a head, stored row ``2i + j`` is Hugging Face row ``j * d / 2 + i``)."""
    rows, heads = weight.out_features, weight.rope_heads
    half = rows // heads // 2
    position = torch.arange(rows)
    head, within = position // (2 * half), position % (2 * half)
    return head * 2 * half + (within % half) * 2 + within // half
