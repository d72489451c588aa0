"""Which of a GGUF file's weights the model reads in place, from the file's own pages.

The converter (``gguf_convert``) lists in ``ggml/mapped.json`` every 2D weight that is stored
in a ggml type the CPU kernels read and whose Hugging Face tensor is the GGUF tensor itself
(not an expert of a stacked tensor, not a part of a fused one), and writes no fp32 copy of it:
its Hugging Face name, its GGUF name, and for a Llama file's Q and K the heads whose rows
llama.cpp interleaved (``rope_heads``; the projection puts its outputs back in rotate-half
order). At load the file is mapped read-only (``gguf_tensors.map_gguf``) and each listed weight
is a view of its pages, shared by every process on the host that maps the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shared.errors import ModelNotFoundError
from shared.model.files import ModelFiles
from shared.model.gguf_tensors import KERNEL_TYPES, map_gguf
from shared.model.quantized import GgmlBlocks, hf_row_order

MAPPED_FILE = "ggml/mapped.json"


@dataclass(frozen=True, slots=True)
class MappedEntry:
    """A weight read from the GGUF file: its tensor there, and the heads whose rows are in
    llama.cpp's interleaved rope order (0: rows in Hugging Face order)."""

    tensor: str
    rope_heads: int = 0


#: The kernels expand 32 weights at a time: a row of plain floats must hold whole chunks of
#: them (a quantized type's blocks always do).
CHUNK = 32


def is_mappable(qtype: int, shape: tuple[int, ...]) -> bool:
    """Whether a tensor of this type and shape can be read in place (a 2D weight in a type the
    kernels read, its rows whole chunks)."""
    return qtype in KERNEL_TYPES and len(shape) == 2 and shape[1] % CHUNK == 0


def write_plan(out_dir: Path, source: Path, plan: dict[str, MappedEntry]) -> None:
    """Records ``plan`` and the source file it refers to (its size and mtime, so a file
    replaced since is refused rather than misread)."""
    stat = source.stat()
    record: dict[str, Any] = {
        "source": str(source.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "tensors": {name: [e.tensor, e.rope_heads] for name, e in sorted(plan.items())},
    }
    path = out_dir / MAPPED_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def read_plan(folder: Path) -> tuple[Path, dict[str, MappedEntry]] | None:
    """The source file and the weights read from it; None for a folder that maps nothing."""
    path = folder / MAPPED_FILE
    if not path.is_file():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    source = Path(record["source"])
    try:
        stat = source.stat()
    except OSError as exc:
        raise ModelNotFoundError(f"{folder}: its weights' file {source} is gone: {exc}") from exc
    if (stat.st_size, stat.st_mtime_ns) != (record["size"], record["mtime_ns"]):
        raise ModelNotFoundError(
            f"{folder}: its weights' file {source} has changed since it was converted; "
            "serve the file itself to convert it again"
        )
    plan = {name: MappedEntry(t, int(h)) for name, (t, h) in record["tensors"].items()}
    return source, plan


def load_mapped(files: ModelFiles) -> dict[str, GgmlBlocks]:
    """The weights ``files`` reads in place, by Hugging Face name, as views of the mapped
    file; empty for a folder that maps nothing."""
    found = read_plan(files.path)
    if found is None:
        return {}
    source, plan = found
    mapped = map_gguf(source, only={e.tensor for e in plan.values()})
    out: dict[str, GgmlBlocks] = {}
    for name, entry in plan.items():
        t = mapped.tensors[entry.tensor]
        out[name] = GgmlBlocks(t.blocks, t.qtype, t.shape[-1], entry.rope_heads)
    return out


def dequantized(weights: dict[str, GgmlBlocks]) -> dict[str, torch.Tensor]:
    """fp32 copies in Hugging Face layout, read with the gguf package's dequantizer: for where
    the CPU kernels are off or the model runs on a GPU."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    out: dict[str, torch.Tensor] = {}
    for name, w in weights.items():
        values = dequantize(w.blocks.numpy(), GGMLQuantizationType(w.qtype))
        tensor = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
        tensor = tensor.reshape(w.out_features, w.in_features)
        out[name] = tensor if not w.rope_heads else tensor[hf_row_order(w)]
    return out
