"""ggml-quantized weights for the CPU kernels: the raw blocks on disk and their packed form.

A projection that has them multiplies few-row inputs (decode steps, short chunks) with
``torch.ops.crescent.ggml_gemm``, which reads 4- or 8-bit blocks instead of fp32 weights; longer
inputs keep the fp32 copy and torch's BLAS, which is faster once the weights are reused by many
rows. Both multiply by the same weight values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from safetensors import safe_open

from shared.model.files import GGML_BLOCKS_FILE, ModelFiles

# ggml type ids the kernels read, with the bytes of one 32-weight block in the file.
GGML_TYPES = {2: 18, 3: 20, 8: 34}  # Q4_0, Q4_1, Q8_0
GGML_BLOCK = 32
# Up to this many rows the kernels beat torch's BLAS on the fp32 weights, as measured by
# bench/ggml_gemm.py (a whole step's projections at 1 to 64 rows; even at 32 rows).
MAX_ROWS = 24


@dataclass(frozen=True, slots=True)
class GgmlBlocks:
    """One weight matrix ``[out, in]`` as the file stores it: ``blocks`` is uint8
    ``[out, in / 32 * block bytes]`` of ggml type ``qtype``. Invariant: the shapes agree."""

    blocks: torch.Tensor
    qtype: int
    in_features: int

    @property
    def out_features(self) -> int:
        return int(self.blocks.shape[0])


def load_ggml_blocks(files: ModelFiles) -> dict[str, GgmlBlocks]:
    """The raw blocks a converted GGUF folder keeps, by Hugging Face name; empty for other
    folders."""
    path = files.path / GGML_BLOCKS_FILE
    if not path.is_file():
        return {}
    out: dict[str, GgmlBlocks] = {}
    with safe_open(str(path), framework="pt", device="cpu") as f:
        types = f.metadata() or {}
        for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            qtype = int(types[name])
            blocks = f.get_tensor(name)
            in_features = blocks.shape[1] // GGML_TYPES[qtype] * GGML_BLOCK
            out[name] = GgmlBlocks(blocks, qtype, in_features)
    return out


def stack_rows(parts: Sequence[GgmlBlocks | None]) -> GgmlBlocks | None:
    """Projections fused by output rows (q/k/v, gate/up) as one matrix; None unless every part
    has blocks of one type and width."""
    present = [p for p in parts if p is not None]
    if not present or len(present) != len(parts):
        return None
    first = present[0]
    if any(p.qtype != first.qtype or p.in_features != first.in_features for p in present):
        return None
    return GgmlBlocks(torch.cat([p.blocks for p in present]), first.qtype, first.in_features)


class PackedGgmlWeight:
    """A weight in the kernels' layout (fp32 scales ahead of each block's quants), callable as
    ``x @ W.T`` for ``x`` of ``[M, in]`` float32. Owns the packed tensor only."""

    __slots__ = ("in_features", "out_features", "packed", "qtype")

    def __init__(self, weight: GgmlBlocks) -> None:
        self.packed = torch.ops.crescent.ggml_repack(
            weight.blocks, weight.qtype, weight.in_features
        )
        self.qtype = weight.qtype
        self.in_features = weight.in_features
        self.out_features = weight.out_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.stride(-1) != 1:
            x = x.contiguous()
        return torch.ops.crescent.ggml_gemm(x, self.packed, self.qtype, self.in_features)

    def dequantize(self) -> torch.Tensor:
        """The fp32 ``[out, in]`` weights the kernel multiplies by."""
        return torch.ops.crescent.ggml_dequantize(self.packed, self.qtype, self.in_features)
