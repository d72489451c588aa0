"""Projections that multiply by their ggml blocks (``GgmlWeight``): exact expansion, right
products, batch-independent rows, clear errors on bad input, and when a projection uses them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from shared.model import cpu_kernels
from shared.model.layers import Linear
from shared.model.quantized import GgmlBlocks, GgmlWeight

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
    assert torch.equal(GgmlWeight(weight).dequantize(), reference(weight))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("m", [1, 3, 8, 9, 17, 40])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 11])
def test_products_match_a_float64_reference(qtype: GGMLQuantizationType, m: int, n: int) -> None:
    weight = quantized(n, 96, qtype, seed=m * 100 + n)
    x = torch.randn(m, 96, generator=torch.Generator().manual_seed(m + n))
    got = GgmlWeight(weight)(x)
    w = reference(weight).double()
    expected = x.double() @ w.T
    # fp32 summation error is bounded by a few ulps of the sum of absolute products.
    bound = 1e-5 * (x.double().abs() @ w.abs().T) + 1e-30
    assert got.shape == (m, n) and got.dtype == torch.float32
    assert bool(((got.double() - expected).abs() <= bound).all())


def test_a_row_does_not_depend_on_the_rest_of_the_batch() -> None:
    weight = GgmlWeight(quantized(50, 576, GGMLQuantizationType.Q4_1))
    x = torch.randn(21, 576, generator=torch.Generator().manual_seed(3))
    together = weight(x)
    alone = torch.cat([weight(x[i : i + 1]) for i in range(21)])
    assert torch.equal(together, alone)


def test_strided_rows_and_empty_batches() -> None:
    weight = GgmlWeight(quantized(6, 64, GGMLQuantizationType.Q8_0))
    wide = torch.randn(5, 128)
    assert torch.equal(weight(wide[:, :64]), weight(wide[:, :64].contiguous()))
    assert weight(torch.empty(0, 64)).shape == (0, 6)


def test_bad_inputs_get_clear_errors() -> None:
    weight = quantized(4, 64, GGMLQuantizationType.Q4_1)
    matmul = torch.ops.crescent.ggml_matmul
    with pytest.raises(RuntimeError, match=r"float32 \[M, 64\]"):
        matmul(torch.randn(2, 32), weight.blocks, weight.qtype, 64)
    with pytest.raises(RuntimeError, match="float32"):
        matmul(torch.randn(2, 64, dtype=torch.float64), weight.blocks, weight.qtype, 64)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        matmul(torch.randn(2, 48), weight.blocks, weight.qtype, 48)
    with pytest.raises(RuntimeError, match="unsupported ggml type 16"):
        matmul(torch.randn(2, 64), weight.blocks, 16, 64)
    with pytest.raises(RuntimeError, match="does not hold"):
        matmul(torch.randn(2, 64), weight.blocks, 8, 64)


def test_parts_in_different_types_multiply_as_one_stacked_matrix() -> None:
    q4 = quantized(4, 64, GGMLQuantizationType.Q4_1, seed=1)
    q8 = quantized(5, 64, GGMLQuantizationType.Q8_0, seed=2)
    both = GgmlWeight([q4, q8])
    assert (both.out_features, both.in_features) == (9, 64)
    x = torch.randn(3, 64)
    assert torch.equal(both(x), torch.cat([GgmlWeight(q4)(x), GgmlWeight(q8)(x)], dim=1))
    assert torch.equal(both.dequantize(), torch.cat([reference(q4), reference(q8)]))
    with pytest.raises(ValueError, match="different widths"):
        GgmlWeight([q4, quantized(4, 96, GGMLQuantizationType.Q4_1)])


def test_rows_kept_in_rope_pair_order_come_out_in_rotate_half_order() -> None:
    # Two heads of head_dim 4: stored rows per head are (a0, b0, a1, b1), Hugging Face's
    # (a0, a1, b0, b1).
    stored = quantized(8, 64, GGMLQuantizationType.Q8_0)
    interleaved = GgmlBlocks(stored.blocks, stored.qtype, 64, rope_heads=2)
    x = torch.randn(2, 64)
    plain, ordered = GgmlWeight(stored)(x), GgmlWeight(interleaved)(x)
    assert torch.equal(ordered, plain[:, [0, 2, 1, 3, 4, 6, 5, 7]])
    assert torch.equal(
        GgmlWeight(interleaved).dequantize(), reference(stored)[[0, 2, 1, 3, 4, 6, 5, 7]]
    )


def test_a_projection_uses_its_blocks_for_few_rows_only() -> None:
    weight = quantized(8, 64, GGMLQuantizationType.Q4_1)
    linear = Linear(64, 8)
    # The fp32 copy is deliberately wrong: which path ran shows in the result.
    linear.weight.data.zero_()
    linear.attach_ggml(GgmlWeight(weight))
    few, many = torch.randn(4, 64), torch.randn(33, 64)
    assert torch.equal(linear(few), GgmlWeight(weight)(few))
    assert torch.equal(linear(many), torch.zeros(33, 8))
    # With no fp32 copy, every input is multiplied from the blocks.
    linear.drop_fp32()
    assert linear.blocks_only
    assert torch.equal(linear(many), GgmlWeight(weight)(many))
    with pytest.raises(ValueError, match="does not fit"):
        Linear(64, 9).attach_ggml(GgmlWeight(weight))
