"""A GGUF file's tensors mapped, not read: views of the file's pages that the kernels expand
to the gguf dequantizer's weights bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from shared.errors import UnsupportedModelError
from shared.model import cpu_kernels
from shared.model.gguf_tensors import map_gguf
from tests.support.llama_cpp import tiny_gguf_file


@pytest.fixture(scope="module", autouse=True)
def kernels(cache_dir: Path) -> None:
    if not cpu_kernels.load(cache_dir):
        pytest.skip("the CPU kernels cannot be built on this machine")


@pytest.mark.slow
@pytest.mark.parametrize("outtype", ["q8_0", "f16", "bf16"])
def test_mapped_tensors_expand_to_the_reference_weights(outtype: str, cache_dir: Path) -> None:
    path = tiny_gguf_file("qwen3", cache_dir, outtype)
    gguf_file = map_gguf(path)
    start = gguf_file.mapping.ctypes.data
    end = start + gguf_file.mapping.nbytes
    types = set()
    for t in GGUFReader(path, "r").tensors:
        mapped = gguf_file.tensors[t.name]
        types.add(mapped.type_name)
        # A view of the file's pages: its bytes lie inside the mapping, nothing was copied.
        assert start <= mapped.blocks.data_ptr() < end, t.name
        got = torch.ops.crescent.ggml_expand(mapped.blocks, mapped.qtype, mapped.shape[-1])
        want = dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        assert np.array_equal(
            got.numpy().reshape(-1).view(np.uint32), want.reshape(-1).view(np.uint32)
        ), t.name
    assert types == {"F32", outtype.upper()}  # norms stay F32, projections take the outtype


def test_a_tensor_type_the_kernels_cannot_read_is_refused_by_name(tmp_path: Path) -> None:
    from gguf import GGUFWriter

    path = tmp_path / "ternary.gguf"
    writer = GGUFWriter(path, "llama")
    blocks = np.zeros((2, 54), dtype=np.uint8)  # two rows of 256 TQ1_0 weights
    writer.add_tensor(
        "blk.0.attn_q.weight", blocks, raw_shape=(2, 54), raw_dtype=GGMLQuantizationType.TQ1_0
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError, match=r"'blk\.0\.attn_q\.weight' is TQ1_0"):
        map_gguf(path)
    # A model that reads it another way (dequantized once) maps only the others.
    assert map_gguf(path, only=set()).tensors == {}
