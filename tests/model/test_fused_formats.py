"""The fused decode step over every ggml type a GGUF file may store its projections in.

A small Llama-shaped model (widths that K-quants' 256-weight blocks divide) gets every
projection as random blocks of one type and no fp32 copy of them. Decoding fused must then give
the op-by-op step's logits and KV, whether that step reads the same blocks (``ggml_matmul``)
or a model built from the blocks expanded to fp32 (torch's BLAS).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.engine.runner import ModelRunner
from shared.engine.scheduler import SchedulerOutput
from shared.model import cpu_kernels
from shared.model.build import build_model
from shared.model.config import ModelConfig
from shared.model.decoder import DecoderForCausalLM
from shared.model.fused_decode import FusedDecoder
from shared.model.kv_cache import KVLayout, PagedKVCache
from shared.model.layers import Linear
from shared.model.quantized import GgmlBlocks, GgmlWeight
from shared.sampling_params import SamplingParams
from tests.model.test_fused_decode import both_ways
from tests.model.test_ggml_formats import HALF_FIELDS, random_rows

T = GGMLQuantizationType
TYPES = [
    T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL,
    T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS,
]  # fmt: skip
HIDDEN, INTER, VOCAB, LAYERS = 256, 512, 640, 2
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": HIDDEN,
    "intermediate_size": INTER,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": VOCAB,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}
PROJECTIONS = {
    "self_attn.q_proj": (HIDDEN, HIDDEN),
    "self_attn.k_proj": (128, HIDDEN),
    "self_attn.v_proj": (128, HIDDEN),
    "self_attn.o_proj": (HIDDEN, HIDDEN),
    "mlp.gate_proj": (INTER, HIDDEN),
    "mlp.up_proj": (INTER, HIDDEN),
    "mlp.down_proj": (HIDDEN, INTER),
}
GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module", autouse=True)
def kernels(cache_dir: Path) -> None:
    if not cpu_kernels.load(cache_dir):
        pytest.skip("the CPU kernels cannot be built on this machine")


def weight_rows(qtype: T, rows: int, k: int, seed: int, std: float = 0.05) -> np.ndarray:
    """Random blocks of ``qtype`` whose weights have about ``std``: a block's weights are
    linear in its fp16 scales, so scaling those scales the weights."""
    blocks = random_rows(qtype, rows, k, seed)
    if qtype not in HALF_FIELDS:
        values = dequantize(blocks, qtype).astype(np.float32) * np.float32(std)
        if qtype == T.F16:
            return values.astype(np.float16).view(np.uint8).reshape(rows, -1)
        halves = (values.view(np.uint32) >> 16).astype(np.uint16)
        return halves.view(np.uint8).reshape(rows, -1)
    gain = std / float(np.std(dequantize(blocks, qtype)))
    per_block = blocks.reshape(rows, k // GGML_QUANT_SIZES[qtype][0], -1)
    for start, end in HALF_FIELDS[qtype]:
        halves = per_block[:, :, start:end].copy().view(np.float16)
        scaled = (halves.astype(np.float32) * np.float32(gain)).astype(np.float16)
        per_block[:, :, start:end] = scaled.view(np.uint8)
    return per_block.reshape(rows, -1)


def models_in(qtype: T) -> tuple[ModelConfig, DecoderForCausalLM, DecoderForCausalLM]:
    """The model with its projections in blocks of ``qtype`` only, and the same model from
    fp32 copies of them."""
    config = ModelConfig.from_hf_dict(CONFIG, model_id=f"formats-{qtype.name}")
    gen = torch.Generator().manual_seed(int(qtype))
    weights = {
        "model.embed_tokens.weight": torch.randn(VOCAB, HIDDEN, generator=gen),
        "model.norm.weight": 1 + 0.1 * torch.randn(HIDDEN, generator=gen),
    }
    for i in range(LAYERS):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            scale = 1 + 0.1 * torch.randn(HIDDEN, generator=gen)
            weights[f"model.layers.{i}.{norm}.weight"] = scale
    mapped: dict[str, GgmlBlocks] = {}
    names = [
        (f"model.layers.{i}.{p}.weight", shape)
        for i in range(LAYERS)
        for p, shape in PROJECTIONS.items()
    ]
    names.append(("lm_head.weight", (VOCAB, HIDDEN)))
    for seed, (name, (rows, k)) in enumerate(names):
        blocks = torch.from_numpy(weight_rows(qtype, rows, k, seed))
        mapped[name] = GgmlBlocks(blocks, int(qtype), k)
    expanded = {n: GgmlWeight(b).dequantize() for n, b in mapped.items()}
    in_blocks = build_model(config, dict(weights), mapped=mapped)
    return config, in_blocks, build_model(config, weights | expanded)


def prefilled(
    config: ModelConfig, model: DecoderForCausalLM, kv_dtype: str, seed: int
) -> tuple[LLMEngine, SchedulerOutput]:
    """An engine over ``model`` (a cache of ``kv_dtype``) whose three requests of 1, 40 and
    150 tokens are prefilled, and its next step: one decode row each."""
    engine_config = EngineConfig(
        num_kv_blocks=48, max_model_len=1024, eos_token_ids=[], kv_dtype=kv_dtype
    )
    cache = PagedKVCache(KVLayout.for_model(config, engine_config.block_size, kv_dtype), 48)
    engine = LLMEngine(ModelRunner(model, cache, False), engine_config, config.model_id)
    gen = torch.Generator().manual_seed(seed)
    for i, length in enumerate((1, 40, 150)):
        prompt = torch.randint(1, VOCAB, (length,), generator=gen).tolist()
        engine.add_request(f"r{i}", prompt, GREEDY)
    while any(s.num_output_tokens == 0 for s in engine._sequences.values()):
        engine.step()
    return engine, engine.scheduler.schedule()


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_fused_steps_over_each_type_match_the_op_by_op_step(qtype: T) -> None:
    config, model, fp32_model = models_in(qtype)
    assert all(m.blocks_only for m in model.modules() if isinstance(m, Linear))
    fused = FusedDecoder.build(model)
    assert fused is not None
    engine, step = prefilled(config, model, "float32", seed=7)
    reference, logits, reference_kv, kv = both_ways(engine.runner, step, fused)
    torch.testing.assert_close(logits, reference, atol=1e-4, rtol=1e-4)
    assert torch.equal(logits.argmax(-1), reference.argmax(-1))
    torch.testing.assert_close(kv, reference_kv, atol=1e-5, rtol=1e-5)
    # And op by op from the fp32 copies (torch's BLAS) of the same weights.
    engine.runner.model = fp32_model
    plain, logits, plain_kv, kv = both_ways(engine.runner, step, fused)
    torch.testing.assert_close(logits, plain, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(kv, plain_kv, atol=1e-5, rtol=1e-5)


# The stored type of each narrow KV dtype, and the relative size of one unit in its last place.
NARROW_KV = {
    "bfloat16": (torch.bfloat16, 2**-7),
    "float16": (torch.float16, 2**-10),
    "fp8_e4m3": (torch.float8_e4m3fn, 2**-3),
}


@pytest.mark.parametrize("kv_dtype", list(NARROW_KV))
def test_a_narrow_cache_reads_and_writes_alike_fused_and_op_by_op(kv_dtype: str) -> None:
    """CRESCENT_KV_DTYPE: both steps store K and V rounded as torch rounds, and attend over
    what the cache holds (the new token included), so they agree as closely as at fp32."""
    config, model, _ = models_in(T.Q4_K)
    fused = FusedDecoder.build(model)
    assert fused is not None
    engine, step = prefilled(config, model, kv_dtype, seed=11)
    expected, unit = NARROW_KV[kv_dtype]
    assert engine.runner.cache.tensor.dtype == expected
    reference, logits, reference_kv, kv = both_ways(engine.runner, step, fused)
    torch.testing.assert_close(logits, reference, atol=1e-4, rtol=1e-4)
    assert torch.equal(logits.argmax(-1), reference.argmax(-1))
    # A value may land one unit of the last place apart where fp32 rounding differed.
    torch.testing.assert_close(kv.float(), reference_kv.float(), atol=1e-2, rtol=max(unit, 1e-2))
    assert (kv != reference_kv).float().mean() < 1e-3
