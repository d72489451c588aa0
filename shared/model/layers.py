"""Building blocks of a Llama-family decoder that know nothing of attention or the KV cache."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shared.model.quantized import MAX_ROWS, PackedGgmlWeight


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
    """A bias-free projection whose weight is stored transposed, ``[in, out]``.

    On CPU, ``x @ W`` with W laid out this way runs up to twice as fast as ``F.linear`` for
    the few-row inputs of decode steps, and no slower for long prefills. Wide projections can
    further be packed into oneDNN's blocked layout (``pack_for_cpu``), which is faster again
    when the output is much wider than the input: the MLP's gate/up and the vocabulary head.
    A projection whose GGUF blocks the CPU kernels read also keeps them (``attach_ggml``) and
    multiplies inputs of up to ``MAX_ROWS`` rows from those.
    """

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self._shape = (in_features, out_features)
        self._packed: torch.Tensor | None = None
        self.ggml: PackedGgmlWeight | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ggml is not None and x.dim() == 2 and x.shape[0] <= MAX_ROWS:
            return self.ggml(x)
        return self.torch_matmul(x)

    def torch_matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W`` by torch's BLAS on the fp32 weights, whatever the row count."""
        if self._packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self._packed, None, "none", [], "")
        return x @ self.weight

    def attach_ggml(self, weight: PackedGgmlWeight) -> None:
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


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin of every position up to the model's context, in fp32.

    ``sin`` is stored with its first half negated: rotating then takes one swap of the two
    halves of ``x`` instead of slicing, negating and concatenating them, with bit-identical
    results (negating a factor and negating the product round the same).
    """

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, head_dim: int, max_positions: int, theta: float) -> None:
        super().__init__()
        # Computed on the CPU even inside a meta-device context: the tables need real values,
        # and tracing these ops on meta would import torch._dynamo (over a second of a start).
        with torch.device("cpu"):
            cos, sin = self._tables(head_dim, max_positions, theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    @staticmethod
    def _tables(
        head_dim: int, max_positions: int, theta: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        inv_freq = 1.0 / (theta**exponents)
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)
        angles = torch.cat((freqs, freqs), dim=-1)
        sin = angles.sin()
        sin[:, : head_dim // 2].neg_()
        return angles.cos(), sin

    def tables(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin for the batch's positions, ``[T, 1, head_dim]``; looked up once
        per step and shared by every layer."""
        return (
            self.cos[positions].unsqueeze(1).to(dtype),
            self.sin[positions].unsqueeze(1).to(dtype),
        )

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotates ``x`` of shape ``[T, heads, head_dim]`` by the positions of ``tables``:
        ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x2, x1)``."""
        t, heads, dim = x.shape
        swapped = x.view(t, heads, 2, dim // 2).flip(2).view(t, heads, dim)
        return x * cos + swapped * sin


def swiglu(gate_up: torch.Tensor, intermediate: int) -> torch.Tensor:
    gate, up = gate_up.split(intermediate, dim=-1)
    return F.silu(gate).mul_(up)
