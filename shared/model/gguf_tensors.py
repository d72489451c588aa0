"""A GGUF file's tensors as views of the file's own pages: nothing is copied or converted.

The file is mapped read-only (``numpy.memmap`` under ``gguf.GGUFReader``), so its pages live
in the page cache once, shared by every process on the host that maps the same file: a
prefill and a decode node together hold one copy of the weights. The CPU kernels read the
blocks where they lie (``torch.ops.crescent.ggml_matmul`` and ``ggml_expand``).
"""

from __future__ import annotations

import warnings
from collections.abc import Collection
from dataclasses import dataclass
from math import prod
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader

from shared.errors import UnsupportedModelError

#: ggml's ids of the plain float types, which other files' weights are read as.
F32, F16, BF16 = (
    int(t) for t in (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)
)
#: The ggml types the kernels read (cpu_kernels/ggml_formats.h).
KERNEL_TYPES = frozenset(
    int(t)
    for t in (
        GGMLQuantizationType.F32,
        GGMLQuantizationType.F16,
        GGMLQuantizationType.BF16,
        GGMLQuantizationType.Q4_0,
        GGMLQuantizationType.Q4_1,
        GGMLQuantizationType.Q5_0,
        GGMLQuantizationType.Q5_1,
        GGMLQuantizationType.Q8_0,
        GGMLQuantizationType.Q2_K,
        GGMLQuantizationType.Q3_K,
        GGMLQuantizationType.Q4_K,
        GGMLQuantizationType.Q5_K,
        GGMLQuantizationType.Q6_K,
        GGMLQuantizationType.IQ4_NL,
        GGMLQuantizationType.IQ4_XS,
    )
)


@dataclass(frozen=True, slots=True)
class GgufTensor:
    """One tensor of a mapped GGUF file.

    ``blocks`` is a read-only uint8 ``[rows, row_bytes]`` view of the file, each row holding
    ``shape[-1]`` weights of ggml type ``qtype``; ``shape`` is in torch order (slowest
    dimension first). Invariant: ``rows == prod(shape[:-1])`` and the row holds exactly
    ``shape[-1]`` weights of ``qtype``.
    """

    name: str
    qtype: int
    shape: tuple[int, ...]
    blocks: torch.Tensor

    @property
    def type_name(self) -> str:
        return GGMLQuantizationType(self.qtype).name


@dataclass(frozen=True, slots=True)
class MappedGguf:
    """A GGUF file mapped read-only: ``mapping`` is the whole file, and every tensor's
    ``blocks`` is a view into it (the views keep the mapping alive)."""

    path: Path
    mapping: np.ndarray
    tensors: dict[str, GgufTensor]


def readonly_view(rows: np.ndarray) -> torch.Tensor:
    """A tensor over rows of a read-only file mapping, without a copy (torch warns that it
    cannot enforce read-only memory; nothing writes to weights)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(rows)


def map_gguf(path: Path, only: Collection[str] | None = None) -> MappedGguf:
    """Every tensor of the GGUF file at ``path`` (or those named in ``only``), by its GGUF
    name, mapped and not read.

    A tensor of a type the kernels cannot read is refused with ``UnsupportedModelError``
    naming it and its type.
    """
    reader = GGUFReader(path, "r")
    tensors: dict[str, GgufTensor] = {}
    for t in reader.tensors:
        if only is not None and t.name not in only:
            continue
        qtype = int(t.tensor_type)
        name = GGMLQuantizationType(qtype).name
        if qtype not in KERNEL_TYPES:
            raise UnsupportedModelError(f"{path}: tensor {t.name!r} is {name}, not supported")
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        weights, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
        row_bytes = shape[-1] // weights * nbytes
        raw = np.asarray(t.data).view(np.uint8).reshape(prod(shape[:-1]), row_bytes)
        tensors[t.name] = GgufTensor(t.name, qtype, shape, readonly_view(raw))
    return MappedGguf(path, reader.data, tensors)
