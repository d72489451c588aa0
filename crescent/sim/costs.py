"""What a simulated node's work costs: the step-time models of prefill and decode, block sizes,
the KV a decode node holds and the bandwidth of a pull, for two clusters.

``local``: Crescent's own engine on this machine (SmolLM2-135M-Instruct, fp32, 2 CPU cores), its
step-time model fitted by the scheduler's own fit (``services.scheduler.timing``) to the engine
figures in ``docs/benchmarks.md`` (prefill of 128/512/2048 tokens at 785/892/664 tok/s; decode
at batch 1/8/32 at 64.2/233.9/280.4 tok/s over 128-token prompts); a pull moves 5.5 GB/s, the
UCX transport's safe default at 16 MiB in the same file. Trace blocks of 512 tokens become KV
blocks of 32, as ``crescent bench`` scales them.

``a800``: a LLaMA2-70B-class model on one 8-GPU A800-SXM4-80GB node per prefill or decode
node, derived from public figures (below) and stated assumptions: this is arithmetic on
published specifications, not a measurement.

- Model (LLaMA 2 paper, Touvron et al. 2023): 69e9 parameters, 80 layers, model width 8192,
  8 KV heads of 128 dimensions (grouped-query attention). Forward cost 2 FLOPs per parameter
  per token, 4 × 8192 FLOPs per layer per query-key pair; KV 2 × 80 × 8 × 128 × 2 bytes =
  327,680 bytes per token in 16-bit, 160 MiB per 512-token block (Mooncake's block size).
- GPU (NVIDIA A800 / A100 80GB SXM datasheet): 312 TFLOPS dense BF16 and 2,039 GB/s HBM2e
  per GPU, 80 GB each.
- Network: 87 GB/s, what Mooncake's Transfer Engine reports moving over 4 × 200 Gbps RoCE
  (kvcache-ai/Mooncake README).
- Assumed: prefill runs at 50% of peak FLOPs; a decode step reads the weights and the batch's
  KV at 70% of peak HBM bandwidth and computes its tokens at 50% of peak FLOPs; 10% of HBM
  beside the weights is workspace; each prefill step costs one read of the weights.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.scheduler.timing import DEFAULT_PRIOR, StepCoefficients, fit_step_time
from shared.cluster_messages import StepSample


@dataclass(frozen=True, slots=True)
class CostModel:
    """The costs of one kind of cluster node. ``block_tokens``: tokens per KV block, one
    trace block each; ``decode_blocks``: KV blocks a decode node can hold; the objectives are
    the defaults of ``crescent sim``."""

    name: str
    block_tokens: int
    block_bytes: int
    prefill: StepCoefficients
    decode: StepCoefficients
    max_num_batched_tokens: int
    decode_blocks: int
    fetch_bandwidth: float
    pull_overhead_s: float
    slo_ttft_s: float
    slo_tpot_s: float

    def pull_seconds(self, blocks: int) -> float:
        """A pull of ``blocks`` blocks from another node (none: free)."""
        if blocks <= 0:
            return 0.0
        return self.pull_overhead_s + blocks * self.block_bytes / self.fetch_bandwidth

    def handoff_seconds(self, tokens: int) -> float:
        """The decode node's pull of a prompt's KV from its prefill node."""
        blocks = -(-tokens // self.block_tokens)
        return self.pull_seconds(blocks)


#: (prompt tokens, tokens/s) of the engine's prefill, docs/benchmarks.md, first run at 9c05254.
LOCAL_PREFILL = ((128, 785.0), (512, 892.0), (2048, 664.0))
#: (batch, tokens/s) of the engine's decode over 128-token prompts, the same run.
LOCAL_DECODE = ((1, 64.2), (8, 233.9), (32, 280.4))
LOCAL_BLOCK_TOKENS = 32
LOCAL_BLOCK_BYTES = 32 * 46_080  # SmolLM2-135M: 30 layers x 3 KV heads x 64 dims x K, V x fp32


def _local() -> CostModel:
    prefill = [StepSample(1, n, 0, n / rate) for n, rate in LOCAL_PREFILL]
    decode = [StepSample(b, b, b * 128, b / rate) for b, rate in LOCAL_DECODE]
    return CostModel(
        name="local",
        block_tokens=LOCAL_BLOCK_TOKENS,
        block_bytes=LOCAL_BLOCK_BYTES,
        prefill=fit_step_time(prefill, DEFAULT_PRIOR),
        decode=fit_step_time(decode, DEFAULT_PRIOR),
        max_num_batched_tokens=2048,
        decode_blocks=1024,  # the engine's default pool (shared/engine/config.py)
        fetch_bandwidth=5.5e9,
        pull_overhead_s=0.002,
        slo_ttft_s=2.0,
        slo_tpot_s=0.2,
    )


A800_GPUS = 8
A800_FLOPS = 312e12  # dense BF16 per GPU
A800_HBM_BYTES_S = 2.039e12
A800_HBM_BYTES = 80e9
LLAMA_PARAMS = 69e9
LLAMA_LAYERS, LLAMA_WIDTH, LLAMA_KV_HEADS, LLAMA_HEAD_DIM = 80, 8192, 8, 128
KV_BYTES_PER_TOKEN = 2 * LLAMA_LAYERS * LLAMA_KV_HEADS * LLAMA_HEAD_DIM * 2
TRACE_BLOCK_TOKENS = 512
PREFILL_FLOPS_SHARE, DECODE_FLOPS_SHARE, HBM_SHARE, WORKSPACE_SHARE = 0.5, 0.5, 0.7, 0.1


def _a800() -> CostModel:
    flops = A800_GPUS * A800_FLOPS
    hbm = A800_GPUS * A800_HBM_BYTES_S * HBM_SHARE
    weights = 2 * LLAMA_PARAMS  # bytes in 16-bit
    per_token_flops = 2 * LLAMA_PARAMS
    per_pair_flops = 4 * LLAMA_WIDTH * LLAMA_LAYERS
    weights_read_s = weights / hbm
    prefill = StepCoefficients(
        base_s=weights_read_s,
        per_token_s=per_token_flops / (flops * PREFILL_FLOPS_SHARE),
        per_attention_s=per_pair_flops / (flops * PREFILL_FLOPS_SHARE),
    )
    # A decode step reads every weight once and every cached token's KV once.
    decode = StepCoefficients(
        base_s=weights_read_s,
        per_token_s=per_token_flops / (flops * DECODE_FLOPS_SHARE),
        per_attention_s=KV_BYTES_PER_TOKEN / hbm,
    )
    block_bytes = KV_BYTES_PER_TOKEN * TRACE_BLOCK_TOKENS
    kv_room = (A800_GPUS * A800_HBM_BYTES - weights) * (1 - WORKSPACE_SHARE)
    return CostModel(
        name="a800",
        block_tokens=TRACE_BLOCK_TOKENS,
        block_bytes=block_bytes,
        prefill=prefill,
        decode=decode,
        max_num_batched_tokens=8192,
        decode_blocks=int(kv_room // block_bytes),
        fetch_bandwidth=87e9,
        pull_overhead_s=0.002,
        slo_ttft_s=10.0,
        slo_tpot_s=0.1,
    )


COST_MODELS = {"local": _local, "a800": _a800}


def cost_model(name: str) -> CostModel:
    """The cost model called ``name`` (``local`` or ``a800``)."""
    try:
        return COST_MODELS[name]()
    except KeyError:
        raise ValueError(f"unknown cost model {name!r}; known: {', '.join(COST_MODELS)}") from None
