"""Every ggml weight format read as a GGUF file stores it (cpu_kernels/ggml_formats.h): the
expanded weights equal the gguf package's dequantizer bit for bit.

The blocks are random bytes with their fp16 scale fields set to finite values, so every bit
pattern of the packed quants and scales is exercised, not only those a quantizer writes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from shared.model import cpu_kernels

T = GGMLQuantizationType
# Where each format keeps its fp16 scales, as (start, end) byte ranges within a block.
HALF_FIELDS: dict[GGMLQuantizationType, list[tuple[int, int]]] = {
    T.Q4_0: [(0, 2)],
    T.Q4_1: [(0, 2), (2, 4)],
    T.Q5_0: [(0, 2)],
    T.Q5_1: [(0, 2), (2, 4)],
    T.Q8_0: [(0, 2)],
    T.IQ4_NL: [(0, 2)],
    T.Q2_K: [(80, 82), (82, 84)],
    T.Q3_K: [(108, 110)],
    T.Q4_K: [(0, 2), (2, 4)],
    T.Q5_K: [(0, 2), (2, 4)],
    T.Q6_K: [(208, 210)],
    T.IQ4_XS: [(0, 2)],
}
PLAIN = {T.F32: np.float32, T.F16: np.float16}
TYPES = [*PLAIN, T.BF16, *HALF_FIELDS]


@pytest.fixture(scope="module", autouse=True)
def kernels(cache_dir: Path) -> None:
    if not cpu_kernels.load(cache_dir):
        pytest.skip("the CPU kernels cannot be built on this machine")


def random_rows(
    qtype: GGMLQuantizationType, rows: int, k: int, seed: int, any_bf16: bool = False
) -> np.ndarray:
    """``rows`` rows of ``k`` weights of ``qtype``, as uint8 [rows, bytes per row];
    ``any_bf16``: BF16 rows of any bit pattern (NaNs and infinities included)."""
    rng = np.random.default_rng(seed)
    weights_per_block, block_bytes = GGML_QUANT_SIZES[qtype]
    if qtype in PLAIN:
        values = rng.standard_normal((rows, k)).astype(PLAIN[qtype])
        return values.view(np.uint8).reshape(rows, -1)
    if qtype == T.BF16 and any_bf16:
        return rng.integers(0, 256, (rows, 2 * k), dtype=np.uint8)  # NaNs expand alike
    if qtype == T.BF16:
        values = rng.standard_normal((rows, k)).astype(np.float32).view(np.uint32) >> 16
        return values.astype(np.uint16).view(np.uint8).reshape(rows, -1)
    blocks = rng.integers(0, 256, (rows, k // weights_per_block, block_bytes), dtype=np.uint8)
    for start, end in HALF_FIELDS[qtype]:
        # Scales over six orders of magnitude, some negative, subnormal ones included.
        halves = (rng.standard_normal(blocks.shape[:2]) * 10.0 ** rng.uniform(-7, 0)).astype(
            np.float16
        )
        blocks[:, :, start:end] = halves.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_expanded_rows_equal_the_reference_dequantizer_bit_for_bit(
    qtype: GGMLQuantizationType,
) -> None:
    k = 512
    for seed in range(3):
        rows = random_rows(qtype, 19, k, seed, any_bf16=True)
        got = torch.ops.crescent.ggml_expand(torch.from_numpy(rows), int(qtype), k)
        want = dequantize(rows, qtype).astype(np.float32).reshape(19, k)
        assert np.array_equal(got.numpy().view(np.uint32), want.view(np.uint32)), qtype.name


def test_rows_may_be_a_view_with_a_row_stride() -> None:
    rows = random_rows(T.Q4_K, 8, 256, seed=5)
    wide = np.zeros((8, rows.shape[1] + 40), dtype=np.uint8)
    wide[:, 7 : 7 + rows.shape[1]] = rows
    view = torch.from_numpy(wide)[:, 7 : 7 + rows.shape[1]]
    got = torch.ops.crescent.ggml_expand(view, int(T.Q4_K), 256)
    assert torch.equal(got, torch.ops.crescent.ggml_expand(torch.from_numpy(rows), 12, 256))


@pytest.mark.parametrize(
    ("qtype", "k", "width", "message"),
    [
        (T.Q2_K, 96, 84, "multiple of 256"),
        (T.Q4_K, 256, 100, "does not hold 256 weights"),
        (T.TQ1_0, 256, 54, "unsupported ggml type 34"),
    ],
)
def test_bad_rows_are_refused_with_what_is_wrong(
    qtype: GGMLQuantizationType, k: int, width: int, message: str
) -> None:
    with pytest.raises(RuntimeError, match=message):
        torch.ops.crescent.ggml_expand(torch.zeros(2, width, dtype=torch.uint8), int(qtype), k)


def expanded(rows: np.ndarray, qtype: GGMLQuantizationType, k: int) -> torch.Tensor:
    return torch.from_numpy(dequantize(rows, qtype).astype(np.float32).reshape(-1, k))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("m", [*range(1, 25), 25, 70, 300])  # every register tile; prefills
def test_products_match_a_float64_reference(qtype: GGMLQuantizationType, m: int) -> None:
    k, n = 512, 263  # past one band of 256 rows, and not a multiple of the tile's 3
    rows = random_rows(qtype, n, k, seed=m)
    weights = expanded(rows, qtype, k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    got = torch.ops.crescent.ggml_matmul(x, torch.from_numpy(rows), int(qtype), k)
    want = x.double() @ weights.double().T
    scale = x.double().abs() @ weights.double().abs().T
    assert ((got.double() - want).abs() <= 1e-5 * scale + 1e-30).all(), qtype.name


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q8_0], ids=lambda t: t.name)
def test_a_rows_product_does_not_depend_on_the_batch(qtype: GGMLQuantizationType) -> None:
    k = 256
    blocks = torch.from_numpy(random_rows(qtype, 40, k, seed=9))
    x = torch.randn(24, k, generator=torch.Generator().manual_seed(3))
    alone = torch.ops.crescent.ggml_matmul(x[:1], blocks, int(qtype), k)
    for m in (2, 8, 9, 24):
        batch = torch.ops.crescent.ggml_matmul(x[:m], blocks, int(qtype), k)
        assert torch.equal(batch[:1], alone), m


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("m", [1, 2, 5, 24])
def test_integer_dot_products_keep_fp32_precision(qtype: GGMLQuantizationType, m: int) -> None:
    """The K-quants multiply few rows on integers (cpu_kernels/ggml_intdot.h): an outlier
    thousands of times the rest, a block of zeros and subnormal values keep a product within
    1e-6 of the sum of magnitudes of the float64 one, ten times tighter than the bound every
    format meets."""
    k, n = 768, 50
    rows = random_rows(qtype, n, k, seed=40 + m)
    weights = expanded(rows, qtype, k).double()
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    x[0, 3] = 5000.0
    x[:, 256:512] = 0.0
    x[-1, 600:640] = 1e-41
    got = torch.ops.crescent.ggml_matmul(x, torch.from_numpy(rows), int(qtype), k).double()
    want = x.double() @ weights.T
    scale = x.double().abs() @ weights.abs().T
    assert ((got - want).abs() <= 1e-6 * scale + 1e-35).all(), qtype.name


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_a_nan_or_infinite_input_is_not_hidden(qtype: GGMLQuantizationType) -> None:
    k = 512
    rows = torch.from_numpy(random_rows(qtype, 6, k, seed=5))
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(1))
    x[0, 7], x[1, 300] = float("nan"), float("inf")
    got = torch.ops.crescent.ggml_matmul(x, rows, int(qtype), k)
    assert got[:2].isnan().all()
    assert got[2].isfinite().all()
