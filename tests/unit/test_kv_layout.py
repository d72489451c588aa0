"""Block geometry and byte sizes of the KV layout."""

from __future__ import annotations

import pytest

from shared.kv.layout import KVLayout, num_blocks_for_bytes
from shared.model.config import ModelConfig


def _smollm2_config() -> ModelConfig:
    return ModelConfig(
        model_id="SmolLM2-135M",
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_ids=(2,),
    )


def test_smollm2_fp32_sizes() -> None:
    layout = KVLayout.for_model(_smollm2_config(), block_size=32, dtype="float32")
    assert layout.itemsize == 4
    assert layout.bytes_per_token == 46_080
    assert layout.block_bytes == 1_474_560
    assert layout.block_shape == (30, 2, 32, 3, 64)
    assert layout.bytes_per_token == _smollm2_config().kv_bytes_per_token


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_halves_the_bytes(dtype: str) -> None:
    fp32 = KVLayout(30, 3, 64, 32, "float32")
    half = KVLayout(30, 3, 64, 32, dtype)
    assert half.itemsize == 2
    assert half.bytes_per_token == 23_040
    assert half.block_bytes * 2 == fp32.block_bytes
    assert half.block_shape == fp32.block_shape


def test_fp8_halves_the_bytes_of_half_precision() -> None:
    half = KVLayout(30, 3, 64, 32, "bfloat16")
    fp8 = KVLayout(30, 3, 64, 32, "fp8_e4m3")
    assert fp8.itemsize == 1
    assert fp8.bytes_per_token == 11_520
    assert fp8.block_bytes * 2 == half.block_bytes
    assert fp8.block_shape == half.block_shape
    # A pool's byte budget holds twice the blocks.
    budget = 1024 * 2**20
    assert num_blocks_for_bytes(fp8, budget) == 2 * num_blocks_for_bytes(half, budget)


def test_num_blocks_for_bytes_floors() -> None:
    layout = KVLayout(30, 3, 64, 32, "float32")
    assert num_blocks_for_bytes(layout, 0) == 0
    assert num_blocks_for_bytes(layout, 1_474_559) == 0
    assert num_blocks_for_bytes(layout, 1_474_560) == 1
    assert num_blocks_for_bytes(layout, 10 * 1_474_560 + 1_474_559) == 10
    assert num_blocks_for_bytes(layout, -5) == 0


@pytest.mark.parametrize("field", ["num_layers", "num_kv_heads", "head_dim", "block_size"])
@pytest.mark.parametrize("bad", [0, -1])
def test_non_positive_dimensions_are_rejected(field: str, bad: int) -> None:
    kwargs: dict[str, object] = {
        "num_layers": 30,
        "num_kv_heads": 3,
        "head_dim": 64,
        "block_size": 32,
        "dtype": "float32",
    }
    kwargs[field] = bad
    with pytest.raises(ValueError, match=field):
        KVLayout(**kwargs)  # type: ignore[arg-type]


def test_non_int_dimension_is_rejected() -> None:
    with pytest.raises(ValueError, match="block_size"):
        KVLayout(30, 3, 64, 32.0, "float32")  # type: ignore[arg-type]


def test_unknown_dtype_is_rejected() -> None:
    with pytest.raises(ValueError, match="int8"):
        KVLayout(30, 3, 64, 32, "int8")


def test_layout_is_frozen_and_hashable() -> None:
    layout = KVLayout(30, 3, 64, 32, "float32")
    assert layout == KVLayout(30, 3, 64, 32, "float32")
    assert hash(layout) == hash(KVLayout(30, 3, 64, 32, "float32"))
    with pytest.raises(AttributeError):
        layout.block_size = 16  # type: ignore[misc]
