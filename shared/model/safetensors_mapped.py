"""A Hugging Face folder's bf16 and fp16 weights read in place, from the shards' own pages.

A safetensors file is an 8-byte header length, a JSON header (each tensor's dtype, shape and
byte range) and the tensors' bytes, row-major. Mapped read-only, a 2D bf16 or fp16 weight is
exactly the kernels' BF16 or F16 rows (``cpu_kernels/ggml_formats.h``), so it is handed over
as a view (``GgmlBlocks``): it stays in its dtype in memory, and the processes on one host that
map the same shard share its pages.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Collection
from pathlib import Path

import numpy as np

from shared.model.files import ModelFiles
from shared.model.gguf_mapped import CHUNK
from shared.model.gguf_tensors import BF16, F16, readonly_view
from shared.model.quantized import GgmlBlocks

#: safetensors dtypes the kernels read as they are stored, with their ggml type ids.
KERNEL_DTYPES = {"BF16": BF16, "F16": F16}


def map_shard(path: Path, wanted: Collection[str]) -> dict[str, GgmlBlocks]:
    """The 2D bf16/fp16 tensors of one shard named in ``wanted``, as views of its pages."""
    with path.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    mapping = np.memmap(path, dtype=np.uint8, mode="r")
    start = 8 + header_len
    out: dict[str, GgmlBlocks] = {}
    for name, info in header.items():
        if name == "__metadata__" or name not in wanted:
            continue
        qtype = KERNEL_DTYPES.get(info["dtype"])
        shape = info["shape"]
        if qtype is None or len(shape) != 2 or shape[1] % CHUNK:
            continue
        lo, hi = info["data_offsets"]
        rows = mapping[start + lo : start + hi].reshape(shape[0], shape[1] * 2)
        out[name] = GgmlBlocks(readonly_view(rows), qtype, int(shape[1]))
    return out


def load_hf_mapped(files: ModelFiles, wanted: Collection[str]) -> dict[str, GgmlBlocks]:
    """Of the weights named in ``wanted``, those a Hugging Face folder stores as 2D bf16 or
    fp16 tensors, by name, as views of their mapped shards."""
    out: dict[str, GgmlBlocks] = {}
    for shard in sorted(files.path.glob("*.safetensors")):
        out |= map_shard(shard, wanted)
    return out
