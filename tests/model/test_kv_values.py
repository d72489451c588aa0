"""The fused step's own conversions into and out of the KV cache's types (kv_values.h) against
torch's, bit for bit: the op-by-op step stores with torch, the fused step with these, and both
must leave the same bytes in the cache and read the same values back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shared.model import cpu_kernels
from shared.model.kv_cache import FP8_E4M3_MAX, to_stored

FP8 = torch.float8_e4m3fn


@pytest.fixture(scope="module", autouse=True)
def kernels(cache_dir: Path) -> None:
    if not cpu_kernels.load(cache_dir):
        pytest.skip("the CPU kernels cannot be built on this machine")


def float_sweep() -> torch.Tensor:
    """Every combination of sign, exponent and the top 11 mantissa bits, each with a few low
    patterns (0, the tie bits of e4m3, bf16 and fp16 rounding, all ones): every range from
    subnormal to infinity and NaN, every rounding case of the 2- and 1-byte types."""
    high = torch.arange(1 << 20, dtype=torch.int64) << 12
    lows = torch.tensor([0, 1, 0x7FF, 0x800, 0x801, 0xFFF, 0x5A5], dtype=torch.int64)
    bits = (high.unsqueeze(1) | lows).flatten()
    return (bits - (bits >= 1 << 31).long() * (1 << 32)).to(torch.int32).view(torch.float32)


def test_fp8_widening_matches_torch_for_every_byte() -> None:
    stored = torch.arange(256, dtype=torch.uint8).view(FP8)
    widened = torch.ops.crescent.kv_load(stored)
    assert torch.equal(widened.view(torch.int32), stored.to(torch.float32).view(torch.int32))


def test_fp8_storing_matches_torch_clamped_bit_for_bit() -> None:
    values = float_sweep()
    stored = torch.ops.crescent.kv_store(values, FP8)
    assert stored.dtype == FP8
    assert torch.equal(stored.view(torch.uint8), to_stored(values, FP8).view(torch.uint8))


def test_fp8_saturates_instead_of_making_nan() -> None:
    values = float_sweep()
    kept = ~values.isnan()
    for stored in (torch.ops.crescent.kv_store(values, FP8), to_stored(values, FP8)):
        widened = stored.to(torch.float32)
        assert not widened[kept].isnan().any()
        assert widened[kept].abs().max() == FP8_E4M3_MAX
        assert widened[~kept].isnan().all()
    beyond = torch.tensor([449.0, 464.0, 479.9, 480.0, 1e30, float("inf")] * 16)
    signed = torch.cat([beyond, -beyond])
    widened = torch.ops.crescent.kv_store(signed, FP8).to(torch.float32)
    assert torch.equal(widened, signed.sign() * FP8_E4M3_MAX)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_widths_match_torch_bit_for_bit(dtype: torch.dtype) -> None:
    values = float_sweep()
    stored = torch.ops.crescent.kv_store(values, dtype)
    expected = values.to(dtype)
    # torch may give a NaN another payload; any NaN is as good as another here.
    nan = values.isnan()
    assert torch.equal(stored[~nan].view(torch.int16), expected[~nan].view(torch.int16))
    assert stored[nan].isnan().all()
    widened = torch.ops.crescent.kv_load(expected)
    assert torch.equal(widened.view(torch.int32), expected.to(torch.float32).view(torch.int32))
