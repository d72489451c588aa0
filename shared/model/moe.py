"""A sparse mixture-of-experts MLP (Qwen3-MoE, Mixtral): a softmax router picks each token's
experts, whose SwiGLU outputs are summed with the router's weights."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shared.model.config import MoeSpec
from shared.model.layers import Linear


class SparseMoe(nn.Module):
    """Owns the router ``[hidden, experts]`` and every expert's fused gate/up
    ``[experts, hidden, 2 * inter]`` and down ``[experts, inter, hidden]`` weights, transposed
    like ``Linear``'s. Experts run one after another over the tokens routed to them, in
    expert order, and their outputs are added in that order (as transformers does)."""

    def __init__(self, hidden: int, spec: MoeSpec) -> None:
        super().__init__()
        self.spec = spec
        self.router = Linear(hidden, spec.num_experts)
        inter = spec.intermediate_size
        self.gate_up = nn.Parameter(torch.empty(spec.num_experts, hidden, 2 * inter))
        self.down = nn.Parameter(torch.empty(spec.num_experts, inter, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spec = self.spec
        probs = torch.softmax(self.router(x), dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probs, spec.top_k, dim=-1)
        if spec.norm_topk_prob:
            weights /= weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype)
        out = torch.zeros_like(x)
        for expert in torch.unique(experts).tolist():
            tokens, slot = torch.where(experts == expert)
            gate, up = (x[tokens] @ self.gate_up[expert]).chunk(2, dim=-1)
            hidden = (F.silu(gate) * up) @ self.down[expert]
            out.index_add_(0, tokens, hidden * weights[tokens, slot, None])
        return out
