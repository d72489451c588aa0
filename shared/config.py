"""Settings read from the environment (every option is a ``CRESCENT_*`` variable)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from shared.cpus import parse_cpus
from shared.model.files import default_cache_dir
from shared.service_settings import ServiceSettings


class EngineSettings(ServiceSettings):
    """Model and engine options of a process that runs the model (prefill, decode, the CLI)."""

    model: str | None = Field(
        default=None, description="A .gguf file or a Hugging Face folder; default: SmolLM2-135M"
    )
    cache_dir: Path = Field(default_factory=default_cache_dir, description="Converted weights")
    block_size: int = Field(default=32, ge=1, le=1024, description="Tokens per KV block")
    kv_cache_mb: int = Field(default=1024, ge=1, description="Memory for this node's KV pool")
    max_num_seqs: int = Field(default=64, ge=1, description="Sequences in one batch at most")
    max_num_batched_tokens: int = Field(default=2048, ge=1, description="Tokens per forward")
    max_model_len: int | None = Field(
        default=None, ge=1, description="Context cap; default: model's"
    )
    device: str = Field(default="auto", description="cpu, cuda, cuda:N or auto")
    dtype: str = Field(default="auto", description="float32, float16, bfloat16 or auto")
    kv_dtype: Literal["auto", "float32", "bfloat16", "float16", "fp8_e4m3", "fp8"] = Field(
        default="auto",
        description="What the KV cache stores, in pools, hand-offs and tiers; auto: the "
        "model's dtype (float32 on CPU). bfloat16 and float16 halve KV memory and traffic; "
        "fp8_e4m3 (alias fp8) quarters them, unscaled, saturating at +-448",
    )
    enable_prefix_caching: bool = Field(default=True, description="reuse cached prompt blocks")
    prefill_order: Literal["deadline", "arrival"] = Field(
        default="deadline",
        description="how a node orders the prompts it computes: deadline (by each request's "
        "ttft_slo_ms and priority, a prompt that fits its share of a step finishing beside "
        "longer ones) or arrival (first come, first served, each prompt taking whole steps)",
    )
    tenant_step_ms: float = Field(
        default=100.0,
        ge=0,
        description="while several tenants' prompts were computed on a node lately, the "
        "longest the prompt tokens of tenants other than the least served take in a step "
        "there, at the node's measured pace (at least 16 tokens): how long the least served "
        "tenant's new prompt can wait for a step already running. 0: no bound",
    )
    num_threads: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="torch threads; default: the pinned cores, else torch's",
    )
    cpu_affinity: str | None = Field(
        default=None, description="Cores this process runs on, as 0-3,6; default: any"
    )
    cpu_kernels: Literal["auto", "off"] = Field(
        default="auto",
        description="auto: few-row matmuls read the GGUF's quantized blocks (fp32 on CPU)",
    )
    fused_decode: bool = Field(
        default=True,
        description="A decode step as one call of the CPU kernels, where they load",
    )
    share_cores: bool = Field(
        default=True,
        description="Each step takes this process's share of the cores that other model "
        "processes on the host are computing on too",
    )

    @field_validator("kv_dtype")
    @classmethod
    def _kv_dtype(cls, value: str) -> str:
        # One name per format: the name is part of every block's hash, so nodes configured
        # with the alias and with the full name share their blocks.
        return "fp8_e4m3" if value == "fp8" else value

    @field_validator("cpu_affinity")
    @classmethod
    def _cores(cls, value: str | None) -> str | None:
        if value:
            parse_cpus(value)
        return value
