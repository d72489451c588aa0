"""Builds a ready engine and tokenizer from settings: the one place that loads a model."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from shared.config import EngineSettings
from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.engine.host_cores import HostCores, default_ledger_path
from shared.engine.runner import ModelRunner
from shared.engine.threads import apply_thread_settings
from shared.kv.layout import KVLayout, num_blocks_for_bytes
from shared.model import cpu_kernels
from shared.model.build import block_weight_names, build_model
from shared.model.decoder import DecoderForCausalLM
from shared.model.files import ModelFiles, resolve_model
from shared.model.gguf_mapped import dequantized, load_mapped
from shared.model.grammar import Grammars
from shared.model.kv_cache import PagedKVCache, torch_dtype
from shared.model.loader import load_state_dict
from shared.model.safetensors_mapped import load_hf_mapped
from shared.model.tokenizer import Tokenizer


@dataclass(slots=True)
class LoadedEngine:
    engine: LLMEngine
    tokenizer: Tokenizer
    files: ModelFiles


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def pick_dtype(name: str, device: torch.device) -> str:
    """fp32 on CPU (bf16 matmuls are emulated and several times slower there); on CUDA bf16
    where the GPU supports it, else fp16."""
    if name != "auto":
        torch_dtype(name)
        return name
    if device.type != "cuda":
        return "float32"
    return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"


def _kernels_on(settings: EngineSettings, device: torch.device, dtype: str) -> bool:
    """Whether the CPU kernels compute from ggml blocks: fp32 on CPU, kernels on and built."""
    if settings.cpu_kernels == "off" or device.type != "cpu" or dtype != "float32":
        return False
    return cpu_kernels.load(settings.cache_dir)


def load_model(settings: EngineSettings, files: ModelFiles) -> DecoderForCausalLM:
    """The model of ``files`` on the settings' device and dtype. Where the CPU kernels compute
    from blocks, a GGUF file's weights, and a Hugging Face folder's bf16/fp16 projections and
    embedding, are read in place (mapped, in their own types); otherwise a GGUF's are expanded
    to fp32 once here."""
    device = pick_device(settings.device)
    dtype = pick_dtype(settings.dtype, device)
    kernels = _kernels_on(settings, device, dtype)
    mapped = load_mapped(files)
    if not mapped and kernels:
        mapped = load_hf_mapped(files, block_weight_names(files.config))
    weights = load_state_dict(files, skip=set(mapped))
    if mapped and not kernels:
        weights |= dequantized(mapped)
        mapped = {}
    return build_model(files.config, weights, device, torch_dtype(dtype), mapped)


def load_engine(settings: EngineSettings) -> LoadedEngine:
    apply_thread_settings(settings.num_threads, settings.cpu_affinity)
    files = resolve_model(settings.model, settings.cache_dir)
    device = pick_device(settings.device)
    dtype = pick_dtype(settings.dtype, device)
    config = files.config
    model = load_model(settings, files)
    tokenizer = Tokenizer.from_dir(files.path)
    kv_dtype = dtype if settings.kv_dtype == "auto" else settings.kv_dtype
    layout = KVLayout.for_model(config, settings.block_size, kv_dtype)
    num_blocks = max(1, num_blocks_for_bytes(layout, settings.kv_cache_mb * 2**20))
    max_len = min(settings.max_model_len or config.context_length, config.context_length)
    eos = set(config.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    engine_config = EngineConfig(
        block_size=settings.block_size,
        num_kv_blocks=num_blocks,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_model_len=max_len,
        enable_prefix_caching=settings.enable_prefix_caching,
        prefill_order=settings.prefill_order,
        tenant_step_s=settings.tenant_step_ms / 1000,
        kv_dtype=kv_dtype,
        eos_token_ids=tuple(sorted(eos)),
    )
    runner = ModelRunner(model, PagedKVCache(layout, num_blocks, device), settings.fused_decode)
    grammars = Grammars(tokenizer.backend_json(), config.vocab_size, engine_config.eos_token_ids)
    engine = LLMEngine(runner, engine_config, config.model_id, grammars)
    if settings.share_cores and device.type == "cpu":
        cores = os.sched_getaffinity(0)
        engine.threads.cores = HostCores(default_ledger_path(), cores, torch.get_num_threads())
    return LoadedEngine(engine, tokenizer, files)
