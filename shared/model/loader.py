"""Loads a model folder's weights (Hugging Face names, fp32, CPU)."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from shared.errors import ModelNotFoundError
from shared.model.files import ModelFiles


def load_state_dict(files: ModelFiles) -> dict[str, torch.Tensor]:
    """All weights of the folder under Hugging Face names, fp32 on CPU.

    ``lm_head.weight`` is present only when the model does not tie it to the embedding.
    """
    shards = sorted(files.path.glob("*.safetensors"))
    if not shards:
        raise ModelNotFoundError(f"Model folder {files.path} has no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        for name, tensor in load_file(str(shard), device="cpu").items():
            if name.endswith("rotary_emb.inv_freq"):
                continue
            state[name] = tensor if tensor.dtype == torch.float32 else tensor.float()
    if files.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    elif "lm_head.weight" not in state:
        raise ModelNotFoundError(f"{files.path}: untied model without lm_head.weight")
    return state
