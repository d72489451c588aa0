"""Loads a model folder's weights (Hugging Face names, fp32, CPU)."""

from __future__ import annotations

from collections.abc import Collection

import torch
from safetensors import safe_open

from shared.errors import ModelNotFoundError
from shared.model.files import ModelFiles


def load_state_dict(
    files: ModelFiles, skip: Collection[str] = frozenset()
) -> dict[str, torch.Tensor]:
    """The weights the folder keeps in safetensors, under Hugging Face names, fp32 on CPU, but
    for those named in ``skip`` (read in place instead). A converted GGUF folder keeps only the
    weights not read from the file in place (``gguf_mapped.load_mapped`` gives the others).

    ``lm_head.weight`` is present only when the model does not tie it to the embedding.
    """
    shards = sorted(files.path.glob("*.safetensors"))
    if not shards:
        raise ModelNotFoundError(f"Model folder {files.path} has no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        with safe_open(str(shard), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if name.endswith("rotary_emb.inv_freq") or name in skip:
                    continue
                tensor = f.get_tensor(name)
                state[name] = tensor if tensor.dtype == torch.float32 else tensor.float()
    if files.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    elif "lm_head.weight" not in state and "lm_head.weight" not in skip:
        raise ModelNotFoundError(f"{files.path}: untied model without lm_head.weight")
    return state
