"""Llama-shaped models of real sizes, written and quantized by llama.cpp's own tools.

Speed and memory do not depend on the weights' values, so the models have random weights: a
Llama 3-style network of about 1B or 8B parameters (SmolLM2's tokenizer and vocabulary, so the
files stay small where the vocabulary does not matter), saved by transformers in fp16,
converted by llama.cpp's ``convert_hf_to_gguf.py`` and quantized by its ``llama-quantize``,
as a user's file would be. llama.cpp's tools (and ``llama-server``, the peer of
``bench/peer.py``) are built once from the ``llama-cpp-python`` source package with cmake
(about 8 minutes on 2 cores). Everything lands under ``$CRESCENT_CACHE_DIR/bench-models``
and ``$CRESCENT_CACHE_DIR/llama-cpp``, never in the repository.

    .venv/bin/python bench/models.py --size 1b [--quant Q4_K_M]

prints the GGUF file's path and the llama-server binary's.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared.model.files import build_folder_once, default_cache_dir, resolve_model
from tests.support.llama_build import llama_cpp_build

SIZES: dict[str, dict[str, Any]] = {
    # Llama 3.2 1B's shape (tied head), and Llama 3 8B's (untied).
    "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
           "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": True},
    "8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": False},
}  # fmt: skip
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def random_model(size: str, out: Path) -> None:
    """A random-weight model of ``size`` in fp16, with SmolLM2's tokenizer, in ``out``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = resolve_model(None, default_cache_dir()).path
    config = LlamaConfig(
        vocab_size=49152,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        bos_token_id=1,
        eos_token_id=2,
        **SIZES[size],
    )
    torch.set_default_dtype(torch.float16)  # an 8B model built in fp32 needs 32 GB
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    del model
    for name in TOKENIZER_FILES:
        if (tokenizer / name).is_file():
            shutil.copy(tokenizer / name, out / name)


def make_gguf(size: str, quant: str, cache: Path, build: Path) -> Path:
    """The model of ``size`` quantized to ``quant`` by llama.cpp's tools in ``build``, made
    once."""
    root = cache / "bench-models"
    target = root / f"llama-{size}-random.{quant}.gguf"
    if target.is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    folder = build_folder_once(root / f"llama-{size}-random-hf", lambda t: random_model(size, t))
    f16 = root / f"llama-{size}-random.f16.gguf"
    converter = build.parent / "convert_hf_to_gguf.py"
    if not f16.is_file():
        partial = f16.with_suffix(".partial")
        subprocess.run(
            [sys.executable, str(converter), str(folder), "--outfile", str(partial),
             "--outtype", "f16"],
            check=True,
        )  # fmt: skip
        partial.replace(f16)
    partial = target.with_suffix(".partial")
    quantize = build / "bin" / "llama-quantize"
    subprocess.run([str(quantize), str(f16), str(partial), quant, "2"], check=True)
    partial.replace(target)
    f16.unlink()
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="1b")
    parser.add_argument("--quant", default="Q4_K_M", help="a llama-quantize type name")
    args = parser.parse_args()
    cache = default_cache_dir()
    build = llama_cpp_build(cache, ("llama-quantize", "llama-server"))
    gguf = make_gguf(args.size, args.quant, cache, build)
    print(f"gguf: {gguf} ({gguf.stat().st_size / 2**20:.0f} MiB)")
    print(f"llama-server: {build / 'bin' / 'llama-server'}")


if __name__ == "__main__":
    main()
