"""One-time conversion of a llama.cpp GGUF file into a Hugging Face style model folder.

The serving path never reads GGUF directly: dequantizing every start would cost seconds, while
the converted fp32 safetensors folder loads in about one. Weights quantized in a format the CPU
kernels read (Q4_0, Q4_1, Q8_0) are also kept as their raw blocks in ``ggml/blocks.safetensors``.
``transformers`` is imported here only, and only to turn the GGUF vocabulary into
``tokenizer.json``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from shared.errors import ModelNotFoundError
from shared.model.config import ModelConfig
from shared.model.files import GGML_BLOCKS_FILE, MODEL_ID_KEY, is_gguf_file
from shared.model.quantized import GGML_TYPES

# Extra key in config.json so the cached folder remembers the GGUF's name without reopening it.

_LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.weight$")


def hf_tensor_name(gguf_name: str) -> str:
    """The Hugging Face parameter name of a llama.cpp tensor name."""
    match = _LAYER_RE.match(gguf_name)
    if match is not None:
        layer, kind = match.groups()
        if kind in _LAYER_TENSORS:
            return f"model.layers.{layer}.{_LAYER_TENSORS[kind]}.weight"
    elif gguf_name.endswith(".weight") and gguf_name[: -len(".weight")] in _GLOBAL_TENSORS:
        return f"{_GLOBAL_TENSORS[gguf_name[: -len('.weight')]]}.weight"
    raise ModelNotFoundError(f"GGUF tensor {gguf_name!r} is not part of a supported Llama model")


def unpermute_rope(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Undoes llama.cpp's reordering of q/k rows (interleaved RoPE pairs -> rotate-half halves)."""
    half_dim = weight.shape[0] // n_head // 2
    return weight.reshape(n_head, half_dim, 2, -1).swapaxes(2, 1).reshape(weight.shape[0], -1)


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def config_from_gguf(reader: Any, source: Path) -> ModelConfig:
    """Builds the model architecture from the ``llama.*`` and ``tokenizer.ggml.*`` metadata."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ModelNotFoundError(f"{source}: GGUF architecture {arch!r} is not supported")
    hidden = int(_field(reader, "llama.embedding_length"))
    heads = int(_field(reader, "llama.attention.head_count"))
    tokens = _field(reader, "tokenizer.ggml.tokens")
    vocab = _field(reader, "llama.vocab_size") or (len(tokens) if tokens else None)
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    names = {t.name for t in reader.tensors}
    return ModelConfig(
        # The file name says which weights and quantization these are; general.name is a
        # free-form training label that often does not.
        model_id=source.stem,
        vocab_size=int(vocab if vocab is not None else _embedding_rows(reader)),
        hidden_size=hidden,
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        num_layers=int(_field(reader, "llama.block_count")),
        num_heads=heads,
        num_kv_heads=int(_field(reader, "llama.attention.head_count_kv", heads)),
        head_dim=int(_field(reader, "llama.attention.key_length", hidden // heads)),
        max_position_embeddings=int(_field(reader, "llama.context_length", 2048)),
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        rms_norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        tie_word_embeddings="output.weight" not in names,
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=() if eos is None else (int(eos),),
    )


def _embedding_rows(reader: Any) -> int:
    for tensor in reader.tensors:
        if tensor.name == "token_embd.weight":
            return int(tensor.shape[-1])
    raise ModelNotFoundError("GGUF file has no token_embd.weight tensor")


def iter_hf_tensors(reader: Any, config: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """Dequantized fp32 weights under Hugging Face names, q/k back in Hugging Face row order."""
    from gguf.quants import dequantize

    for tensor in reader.tensors:
        name = hf_tensor_name(tensor.name)
        # GGUF lists dimensions fastest-first; torch wants them slowest-first.
        shape = tuple(int(d) for d in reversed(tensor.shape))
        array = dequantize(tensor.data, tensor.tensor_type).astype(np.float32).reshape(shape)
        if name.endswith("q_proj.weight"):
            array = unpermute_rope(array, config.num_heads)
        elif name.endswith("k_proj.weight"):
            array = unpermute_rope(array, config.num_kv_heads)
        yield name, torch.from_numpy(np.ascontiguousarray(array))


def iter_ggml_blocks(reader: Any, config: ModelConfig) -> Iterator[tuple[str, torch.Tensor, int]]:
    """The raw blocks ``[rows, bytes]`` and ggml type of every projection stored in a type the
    CPU kernels read, under Hugging Face names, q/k rows in Hugging Face order."""
    for tensor in reader.tensors:
        qtype = int(tensor.tensor_type)
        if qtype not in GGML_TYPES or len(tensor.shape) != 2:
            continue
        name = hf_tensor_name(tensor.name)
        blocks = np.asarray(tensor.data)
        # A block never spans two rows, so reordering q/k rows moves whole blocks.
        if name.endswith("q_proj.weight"):
            blocks = unpermute_rope(blocks, config.num_heads)
        elif name.endswith("k_proj.weight"):
            blocks = unpermute_rope(blocks, config.num_kv_heads)
        yield name, torch.from_numpy(np.array(blocks, dtype=np.uint8)), qtype


def _write_ggml_blocks(reader: Any, config: ModelConfig, out_dir: Path) -> None:
    blocks: dict[str, torch.Tensor] = {}
    types: dict[str, str] = {}
    for name, tensor, qtype in iter_ggml_blocks(reader, config):
        blocks[name] = tensor
        types[name] = str(qtype)
    if blocks:
        path = out_dir / GGML_BLOCKS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(blocks, str(path), metadata=types)


def _write_tokenizer(source: Path, out_dir: Path, template: str | None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    tokenizer.save_pretrained(str(out_dir))
    # Older transformers releases keep the template inside tokenizer_config.json instead.
    if template and not (out_dir / "chat_template.jinja").exists():
        config_path = out_dir / "tokenizer_config.json"
        tok_config = json.loads(config_path.read_text(encoding="utf-8"))
        if not tok_config.get("chat_template"):
            (out_dir / "chat_template.jinja").write_text(template, encoding="utf-8")


def convert_gguf(source: Path, out_dir: Path) -> ModelConfig:
    """Writes ``model.safetensors``, ``config.json`` and the tokenizer files of ``source``.

    ``out_dir`` must exist; the caller is responsible for publishing it atomically.
    """
    from gguf import GGUFReader

    if not is_gguf_file(source):
        raise ModelNotFoundError(f"{source} is not a GGUF file")
    reader = GGUFReader(source)
    config = config_from_gguf(reader, source)
    template = _field(reader, "tokenizer.chat_template")
    tensors = dict(iter_hf_tensors(reader, config))
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    del tensors
    _write_ggml_blocks(reader, config, out_dir)
    del reader
    hf_config = {**config.to_hf_dict(), MODEL_ID_KEY: config.model_id}
    (out_dir / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n", encoding="utf-8")
    _write_tokenizer(source, out_dir, template)
    return config
