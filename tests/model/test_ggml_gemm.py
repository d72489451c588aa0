"""The CPU kernels that multiply by ggml-quantized weights: exact expansion, right products,
batch-independent rows, clear errors on bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from shared.model import cpu_kernels
from shared.model.layers import Linear
from shared.model.quantized import GgmlBlocks, PackedGgmlWeight, stack_rows

TYPES = [GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0]


@pytest.fixture(scope="module", autouse=True)
def kernels(cache_dir: Path) -> None:
    if not cpu_kernels.load(cache_dir):
        pytest.skip("the CPU kernels cannot be built on this machine")


def random_weights(rows: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # Rows of very different magnitudes exercise small and large fp16 scales.
    scale = 10.0 ** rng.uniform(-3, 1, size=(rows, 1))
    return (rng.standard_normal((rows, k)) * scale).astype(np.float32)


def quantized(rows: int, k: int, qtype: GGMLQuantizationType, seed: int = 0) -> GgmlBlocks:
    blocks = quantize(random_weights(rows, k, seed), qtype)
    return GgmlBlocks(torch.from_numpy(np.array(blocks)), int(qtype), k)


def reference(weight: GgmlBlocks) -> torch.Tensor:
    qtype = GGMLQuantizationType(weight.qtype)
    expanded = dequantize(weight.blocks.numpy(), qtype).astype(np.float32)
    return torch.from_numpy(expanded.reshape(weight.out_features, weight.in_features))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_expansion_is_bit_identical_to_the_reference_dequantizer(
    qtype: GGMLQuantizationType,
) -> None:
    weight = quantized(37, 160, qtype)
    assert torch.equal(PackedGgmlWeight(weight).dequantize(), reference(weight))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("m", [1, 3, 8, 9, 17, 40])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 11])
def test_products_match_a_float64_reference(qtype: GGMLQuantizationType, m: int, n: int) -> None:
    weight = quantized(n, 96, qtype, seed=m * 100 + n)
    x = torch.randn(m, 96, generator=torch.Generator().manual_seed(m + n))
    got = PackedGgmlWeight(weight)(x)
    w = reference(weight).double()
    expected = x.double() @ w.T
    # fp32 summation error is bounded by a few ulps of the sum of absolute products.
    bound = 1e-5 * (x.double().abs() @ w.abs().T) + 1e-30
    assert got.shape == (m, n) and got.dtype == torch.float32
    assert bool(((got.double() - expected).abs() <= bound).all())


def test_a_row_does_not_depend_on_the_rest_of_the_batch() -> None:
    weight = PackedGgmlWeight(quantized(50, 576, GGMLQuantizationType.Q4_1))
    x = torch.randn(21, 576, generator=torch.Generator().manual_seed(3))
    together = weight(x)
    alone = torch.cat([weight(x[i : i + 1]) for i in range(21)])
    assert torch.equal(together, alone)


def test_strided_rows_and_empty_batches() -> None:
    weight = PackedGgmlWeight(quantized(6, 64, GGMLQuantizationType.Q8_0))
    wide = torch.randn(5, 128)
    assert torch.equal(weight(wide[:, :64]), weight(wide[:, :64].contiguous()))
    assert weight(torch.empty(0, 64)).shape == (0, 6)


def test_bad_inputs_get_clear_errors() -> None:
    weight = PackedGgmlWeight(quantized(4, 64, GGMLQuantizationType.Q4_1))
    gemm = torch.ops.crescent.ggml_gemm
    with pytest.raises(RuntimeError, match=r"float32 \[M, 64\]"):
        gemm(torch.randn(2, 32), weight.packed, weight.qtype, 64)
    with pytest.raises(RuntimeError, match="float32"):
        gemm(torch.randn(2, 64, dtype=torch.float64), weight.packed, weight.qtype, 64)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        gemm(torch.randn(2, 48), weight.packed, weight.qtype, 48)
    with pytest.raises(RuntimeError, match="unsupported ggml type 12"):
        gemm(torch.randn(2, 64), weight.packed, 12, 64)
    with pytest.raises(RuntimeError, match="does not hold"):
        gemm(torch.randn(2, 64), weight.packed, 8, 64)
    with pytest.raises(RuntimeError, match="does not hold"):
        torch.ops.crescent.ggml_repack(torch.zeros(4, 39, dtype=torch.uint8), 3, 64)


def test_fused_parts_stack_only_when_they_agree() -> None:
    q4 = quantized(4, 64, GGMLQuantizationType.Q4_1)
    q8 = quantized(4, 64, GGMLQuantizationType.Q8_0)
    stacked = stack_rows([q4, q4])
    assert stacked is not None and stacked.out_features == 8
    assert stack_rows([q4, q8]) is None
    assert stack_rows([q4, None]) is None
    assert stack_rows([q4, quantized(4, 96, GGMLQuantizationType.Q4_1)]) is None


def test_a_projection_uses_its_blocks_for_few_rows_only() -> None:
    weight = quantized(8, 64, GGMLQuantizationType.Q4_1)
    linear = Linear(64, 8)
    # The fp32 copy is deliberately wrong: which path ran shows in the result.
    linear.weight.data.zero_()
    linear.attach_ggml(PackedGgmlWeight(weight))
    few, many = torch.randn(4, 64), torch.randn(33, 64)
    assert torch.equal(linear(few), PackedGgmlWeight(weight)(few))
    assert torch.equal(linear(many), torch.zeros(33, 8))
    with pytest.raises(ValueError, match="does not fit"):
        Linear(64, 9).attach_ggml(PackedGgmlWeight(weight))
