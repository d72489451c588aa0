"""One-time conversion of a llama.cpp GGUF file into a Hugging Face style model folder.

The folder holds the model's config.json (``gguf_arch`` builds it per architecture), its
tokenizer, and an fp32 safetensors copy of only those weights the model cannot read from the
GGUF file in place, under transformers' names and layouts, with every change llama.cpp's
converter made undone (q/k row order for llama, experts stacked into one tensor, Gemma's norms
stored as ``1 + w``): the norms and biases, experts, and any tensor of a type the CPU kernels
do not read. Every other weight (the embeddings and the projections, whatever their ggml type)
is listed in ``ggml/mapped.json`` and read from the file's own pages at load
(``gguf_mapped``). ``dequantize_all`` writes every weight in fp32 instead: the folder
transformers reads. ``transformers`` is imported here only, and only to turn the GGUF
vocabulary into ``tokenizer.json``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from shared.errors import ModelNotFoundError, UnsupportedModelError
from shared.model.config import ModelConfig
from shared.model.files import MODEL_ID_KEY, is_gguf_file
from shared.model.generation_config import GENERATION_CONFIG, from_gguf
from shared.model.gguf_arch import ARCHS, GLOBAL_NAMES, ArchSpec, Experts, hf_config
from shared.model.gguf_mapped import MappedEntry, is_mappable, write_plan
from shared.model.gguf_meta import GgufMeta
from shared.model.gguf_rope import ROPE_TENSORS
from shared.model.settings import keep_hub_offline

_LAYER_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_EXPERT_KINDS = ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


def hf_tensor_name(gguf_name: str, spec: ArchSpec | None = None) -> str:
    """The Hugging Face name of a llama.cpp tensor that maps to exactly one tensor (Llama's
    names unless ``spec`` says another architecture)."""
    spec = spec or ARCHS["llama"]
    match = _LAYER_RE.match(gguf_name)
    if match is not None:
        layer, kind, suffix = match.groups()
        if kind in spec.layer_names:
            return f"model.layers.{layer}.{spec.layer_names[kind]}.{suffix}"
    else:
        base, _, suffix = gguf_name.rpartition(".")
        if base in GLOBAL_NAMES and suffix == "weight":
            return f"{GLOBAL_NAMES[base]}.weight"
    raise UnsupportedModelError(
        f"GGUF tensor {gguf_name!r} is not part of a supported {spec.name} model"
    )


def unpermute_rope(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Undoes llama.cpp's reordering of q/k rows (interleaved RoPE pairs -> rotate-half halves).

    Works on weights ``[rows, cols]`` and on biases ``[rows]`` alike.
    """
    rows = weight.shape[0]
    half_dim = rows // n_head // 2
    moved = weight.reshape(n_head, half_dim, 2, -1).swapaxes(2, 1)
    return moved.reshape(weight.shape)


class _Converter:
    """Turns the tensors of one GGUF file into the Hugging Face tensors they were made from."""

    def __init__(self, meta: GgufMeta, spec: ArchSpec, config: dict[str, Any]) -> None:
        self.meta = meta
        self.spec = spec
        self.config = config
        self.experts: Experts | None = spec.experts(config)

    def check_names(self) -> None:
        """Refuses, before any work, a tensor no rule below knows."""
        for name in self.meta.tensors:
            self.route(name)

    def route(self, name: str) -> str:
        """How tensor ``name`` is converted: "skip", "global", "layer", "qkv" or "experts"."""
        if name in ROPE_TENSORS:
            return "skip"  # folded into rope_parameters
        match = _LAYER_RE.match(name)
        if match is None:
            if name == "output.weight" and self.config["tie_word_embeddings"]:
                return "skip"  # Gemma 2: llama.cpp reads the head from token_embd
            hf_tensor_name(name, self.spec)
            return "global"
        kind = match.group(2)
        if self.experts is not None and kind in _EXPERT_KINDS:
            return "experts"
        if kind == "attn_qkv" and kind not in self.spec.layer_names:
            return "qkv"  # fused by the converter's --fuse-qkv
        hf_tensor_name(name, self.spec)
        return "layer"

    def convert(self, name: str, array: np.ndarray) -> Iterator[tuple[str, np.ndarray]]:
        """The Hugging Face tensors of GGUF tensor ``name`` (``array`` in torch order)."""
        how = self.route(name)
        if how == "skip":
            return
        match = _LAYER_RE.match(name)
        if how == "global" or match is None:
            yield self.finish(hf_tensor_name(name, self.spec), name, array)
            return
        layer, kind, suffix = match.groups()
        prefix = f"model.layers.{layer}."
        if how == "qkv":
            yield from self._split_qkv(layer, suffix, array)
        elif how == "experts":
            yield from self._split_experts(prefix, kind, suffix, array)
        else:
            yield self.finish(hf_tensor_name(name, self.spec), name, array)

    def rope_heads(self, gguf_name: str) -> int:
        """The heads whose rows llama.cpp interleaved in this tensor (Q and K of a llama file);
        0 when its rows are in Hugging Face order."""
        kind = gguf_name.split(".")[-2]
        if not self.spec.permute_qk or kind not in ("attn_q", "attn_k"):
            return 0
        key = "num_attention_heads" if kind == "attn_q" else "num_key_value_heads"
        return int(self.config[key])

    def finish(self, hf_name: str, gguf_name: str, array: np.ndarray) -> tuple[str, np.ndarray]:
        heads = self.rope_heads(gguf_name)
        if heads:
            array = unpermute_rope(array, heads)
        if self.spec.norm_offset and hf_name.endswith("norm.weight"):
            # Gemma scales by (1 + w) and stores w; llama.cpp's converter stored 1 + w. For
            # values in [0.5, 2] the subtraction is exact, so w comes back as it was stored.
            array = array - np.float32(self.spec.norm_offset)
        return hf_name, array

    def _split_qkv(
        self, layer: str, suffix: str, array: np.ndarray
    ) -> Iterator[tuple[str, np.ndarray]]:
        head_dim = self.config["head_dim"]
        q = self.config["num_attention_heads"] * head_dim
        kv = self.config["num_key_value_heads"] * head_dim
        if array.shape[0] != q + 2 * kv:
            raise UnsupportedModelError(
                f"{self.meta.source}: blk.{layer}.attn_qkv has {array.shape[0]} rows"
            )
        parts = {"attn_q": array[:q], "attn_k": array[q : q + kv], "attn_v": array[q + kv :]}
        for kind, part in parts.items():
            name = f"blk.{layer}.{kind}.{suffix}"
            yield self.finish(hf_tensor_name(name, self.spec), name, part)

    def _split_experts(
        self, prefix: str, kind: str, suffix: str, array: np.ndarray
    ) -> Iterator[tuple[str, np.ndarray]]:
        experts = self.experts
        assert experts is not None
        if kind == "ffn_gate_inp":
            yield f"{prefix}{experts.router}.{suffix}", array
            return
        # [experts, out, in]: one transformers tensor per expert.
        pattern = {"ffn_gate_exps": experts.gate, "ffn_up_exps": experts.up}.get(kind, experts.down)
        for e in range(array.shape[0]):
            yield f"{prefix}{pattern.format(e=e)}.{suffix}", array[e]


def read_gguf(source: Path) -> tuple[GgufMeta, ArchSpec, dict[str, Any]]:
    """The file's metadata, architecture and transformers config dict; refuses anything
    Crescent does not read (architecture, metadata, tensor) by name."""
    from gguf import GGUFReader

    if not is_gguf_file(source):
        raise ModelNotFoundError(f"{source} is not a GGUF file")
    meta = GgufMeta(GGUFReader(source), source)
    spec, config = hf_config(meta)
    _Converter(meta, spec, config).check_names()
    return meta, spec, config


def config_from_gguf(source: Path) -> ModelConfig:
    """The model architecture a GGUF file describes, as Crescent reads it."""
    _, _, config = read_gguf(source)
    return ModelConfig.from_hf_dict(config, model_id=source.stem)


def iter_hf_tensors(
    meta: GgufMeta, spec: ArchSpec, config: dict[str, Any], skip: frozenset[str] = frozenset()
) -> Iterator[tuple[str, torch.Tensor]]:
    """Dequantized fp32 weights under Hugging Face names and in Hugging Face layouts, but for
    the GGUF tensors named in ``skip``."""
    from gguf.quants import dequantize

    converter = _Converter(meta, spec, config)
    for tensor in meta.reader.tensors:
        if tensor.name in skip:
            continue
        shape = meta.tensors[tensor.name]
        array = dequantize(tensor.data, tensor.tensor_type).astype(np.float32).reshape(shape)
        for name, out in converter.convert(tensor.name, array):
            yield name, torch.from_numpy(np.ascontiguousarray(out))


def mapping_plan(meta: GgufMeta, spec: ArchSpec, config: dict[str, Any]) -> dict[str, MappedEntry]:
    """The weights read from the file in place (``gguf_mapped``), by Hugging Face name."""
    converter = _Converter(meta, spec, config)
    plan: dict[str, MappedEntry] = {}
    for tensor in meta.reader.tensors:
        shape = tuple(int(d) for d in meta.tensors[tensor.name])
        if not is_mappable(int(tensor.tensor_type), shape):
            continue
        if converter.route(tensor.name) not in ("global", "layer"):
            continue
        heads = converter.rope_heads(tensor.name)
        plan[hf_tensor_name(tensor.name, spec)] = MappedEntry(tensor.name, heads)
    return plan


def _write_tokenizer(source: Path, out_dir: Path, template: str | None) -> None:
    keep_hub_offline()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    tokenizer.save_pretrained(str(out_dir))
    # Older transformers releases keep the template inside tokenizer_config.json instead.
    if template and not (out_dir / "chat_template.jinja").exists():
        config_path = out_dir / "tokenizer_config.json"
        tok_config = json.loads(config_path.read_text(encoding="utf-8"))
        if not tok_config.get("chat_template"):
            (out_dir / "chat_template.jinja").write_text(template, encoding="utf-8")


def convert_gguf(source: Path, out_dir: Path, dequantize_all: bool = False) -> ModelConfig:
    """Writes ``config.json``, the tokenizer files, ``generation_config.json`` (where the file
    has sampling defaults) and ``model.safetensors`` of ``source``:
    fp32 copies of the weights the model does not read from the file in place, whose list
    goes to ``ggml/mapped.json`` (``gguf_mapped``). ``dequantize_all``: every weight in fp32
    and nothing mapped (a folder transformers can load on its own).

    ``out_dir`` must exist; the caller is responsible for publishing it atomically.
    """
    meta, spec, hf = read_gguf(source)
    # The file name says which weights and quantization these are; general.name is a
    # free-form training label that often does not.
    hf[MODEL_ID_KEY] = source.stem
    # Crescent must serve what it converts: its own reader refuses here, before any work.
    config = ModelConfig.from_hf_dict(hf, model_id=source.stem)
    template = meta.raw("tokenizer.chat_template")
    generation = from_gguf(meta)
    plan = {} if dequantize_all else mapping_plan(meta, spec, hf)
    skip = frozenset(e.tensor for e in plan.values())
    tensors = dict(iter_hf_tensors(meta, spec, hf, skip))
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    del tensors
    del meta
    if plan:
        write_plan(out_dir, source, plan)
    if generation:  # llama.cpp's general.sampling.* keys, where the file has them
        text = json.dumps(generation, indent=2) + "\n"
        (out_dir / GENERATION_CONFIG).write_text(text, encoding="utf-8")
    (out_dir / "config.json").write_text(json.dumps(hf, indent=2) + "\n", encoding="utf-8")
    _write_tokenizer(source, out_dir, template)
    return config
