"""The default SmolLM2 file re-quantized to Q4_K_M by llama.cpp's own ``llama-quantize``, as a
user's file would be, answers greedily as transformers does on the same file.

llama-quantize's Q4_K_M mix on this model: Q4_K and Q6_K where a row holds whole 256-value
K-quant blocks (the MLP's down projection, 1,536 values a row), and its fallbacks Q5_0 and
Q8_0 where it does not (576 values a row). transformers reads the file through the ``gguf``
package's dequantizer, which Crescent's weights equal bit for bit; Crescent computes from the
blocks in place, with the integer K-quant products where the kernels build.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from gguf import GGUFReader

from shared.config import EngineSettings
from shared.engine.factory import load_model
from shared.model.files import default_model_file, resolve_model
from shared.model.tokenizer import Tokenizer
from tests.conftest import RealEngineFactory
from tests.model.prompts import CHAT_PROMPTS, RAW_PROMPTS, long_document
from tests.model.test_oracle import greedy_mismatches, hf_greedy
from tests.support.llama_build import requantized

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def requantized_file(cache_dir: Path) -> Path:
    return requantized(cache_dir, default_model_file(), "Q4_K_M")


def test_the_file_holds_llama_cpps_k_quant_mix(requantized_file: Path) -> None:
    types = {t.tensor_type.name for t in GGUFReader(requantized_file).tensors}
    assert {"Q4_K", "Q6_K"} <= types, types
    assert types <= {"F32", "Q4_K", "Q6_K", "Q5_0", "Q8_0"}, types


def test_greedy_tokens_equal_transformers_on_the_same_file(
    requantized_file: Path,
    cache_dir: Path,
    tokenizer: Tokenizer,
    make_real_engine: RealEngineFactory,
) -> None:
    from transformers import AutoModelForCausalLM

    hf_model: Any = AutoModelForCausalLM.from_pretrained(
        str(requantized_file.parent), gguf_file=requantized_file.name, dtype=torch.float32
    ).eval()
    files = resolve_model(requantized_file, cache_dir)
    model = load_model(EngineSettings(cache_dir=cache_dir, device="cpu"), files)
    # Fewer than the oracle's prompts (tests/model/test_oracle.py), a long one among them.
    texts = [*RAW_PROMPTS[:5], long_document(1, 1600, tokenizer)]
    chats = CHAT_PROMPTS[:3]
    prompts = [tokenizer.encode(t) for t in texts]
    prompts += [tokenizer.apply_chat_template(c) for c in chats]
    cases = [(prompt, hf_greedy(hf_model, prompt)) for prompt in prompts]
    engine = make_real_engine(with_model=model, num_kv_blocks=400, max_num_batched_tokens=1024)
    assert not greedy_mismatches(engine, cases)
