"""Building blocks of a decoder that know nothing of attention or the KV cache."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shared.model.quantized import MAX_ROWS, GgmlBlocks, GgmlWeight


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale (torch's fused kernel: one op instead of six,
    bit-identical in fp32 to the textbook formula)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class Linear(nn.Module):
    """A projection whose weight is stored transposed, ``[in, out]``, with an optional bias.

    On CPU, ``x @ W`` with W laid out this way runs up to twice as fast as ``F.linear`` for
    the few-row inputs of decode steps, and no slower for long prefills. Wide projections can
    further be packed into oneDNN's blocked layout (``pack_for_cpu``), which is faster again
    when the output is much wider than the input: the MLP's gate/up and the vocabulary head.
    A projection whose GGUF blocks the CPU kernels read also keeps them (``attach_ggml``) and
    multiplies inputs of up to ``MAX_ROWS`` rows from those; one given no fp32 copy
    (``blocks_only``) multiplies every input from them.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self._shape = (in_features, out_features)
        self._packed: torch.Tensor | None = None
        self.ggml: GgmlWeight | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ggml is not None and (self.blocks_only or x.numel() <= MAX_ROWS * x.shape[-1]):
            if x.dim() == 2:
                out = self.ggml(x)
            else:
                out = self.ggml(x.reshape(-1, x.shape[-1])).view(*x.shape[:-1], -1)
        else:
            out = self.torch_matmul(x)
        return out if self.bias is None else out.add_(self.bias)

    @property
    def blocks_only(self) -> bool:
        """Whether the projection has no fp32 copy, only its blocks."""
        return self.ggml is not None and self._packed is None and self.weight.numel() == 0

    def drop_fp32(self) -> None:
        """Leaves the blocks (``attach_ggml`` first) as the projection's only weights."""
        assert self.ggml is not None
        self._packed = None
        self.weight = nn.Parameter(torch.empty(0), requires_grad=False)

    def torch_matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W`` by torch's BLAS on the fp32 weights, whatever the row count."""
        if self._packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self._packed, None, "none", [], "")
        return x @ self.weight

    def attach_ggml(self, weight: GgmlWeight) -> None:
        """Few-row inputs are multiplied from ``weight``, which must hold this projection's
        weights (``[out, in]``, the transpose of ``self.weight``)."""
        if (weight.out_features, weight.in_features) != (self.out_features, self.in_features):
            raise ValueError(
                f"ggml weight [{weight.out_features}, {weight.in_features}] does not fit a "
                f"projection {self.in_features} -> {self.out_features}"
            )
        self.ggml = weight

    @property
    def in_features(self) -> int:
        return self._shape[0]

    @property
    def out_features(self) -> int:
        return self._shape[1]

    def pack_for_cpu(self) -> bool:
        """Switches to a oneDNN-packed copy of the weight; False where that is unavailable.
        The packed copy replaces the plain one, so memory does not grow."""
        w = self.weight
        if w.device.type != "cpu" or w.dtype != torch.float32:
            return False
        if not torch.backends.mkldnn.is_available():
            return False
        self._packed = torch.ops.mkldnn._reorder_linear_weight(w.detach().t().contiguous())
        # The plain copy is dead weight from here on; an empty tensor keeps the attribute.
        self.weight = nn.Parameter(w.detach().new_empty(0), requires_grad=False)
        return True


class BlockEmbedding(nn.Module):
    """Token embeddings read from a GGUF file's blocks: each row looked up is expanded to fp32
    on the way (``ggml_expand``), so no fp32 table is kept. Owns a view of the blocks."""

    def __init__(self, weight: GgmlBlocks) -> None:
        super().__init__()
        self.blocks = weight
        self.num_embeddings, self.embedding_dim = weight.out_features, weight.in_features

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        w = self.blocks
        rows = w.blocks.index_select(0, ids.reshape(-1))
        out = torch.ops.crescent.ggml_expand(rows, w.qtype, w.in_features)
        return out.view(*ids.shape, w.in_features)


def gated(gate_up: torch.Tensor, intermediate: int, act: str) -> torch.Tensor:
    """``act(gate) * up`` of a fused gate/up projection: SwiGLU for "silu", GeGLU with tanh's
    approximation for "gelu_pytorch_tanh" (Gemma)."""
    gate, up = gate_up.split(intermediate, dim=-1)
    if act == "silu":
        return F.silu(gate).mul_(up)
    return F.gelu(gate, approximate="tanh").mul_(up)


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """``tanh(x / cap) * cap``: keeps logits within (-cap, cap) (Gemma 2)."""
    return torch.tanh(x / cap) * cap
