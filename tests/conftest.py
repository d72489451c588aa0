"""Session fixtures: the converted default model, our tokenizer and the transformers oracle."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shared.config import EngineSettings
from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.engine.factory import load_model
from shared.engine.runner import ModelRunner
from shared.kv.layout import KVLayout
from shared.model.decoder import DecoderForCausalLM
from shared.model.files import ModelFiles, default_model_file, resolve_model
from shared.model.grammar import Grammars
from shared.model.kv_cache import PagedKVCache
from shared.model.tokenizer import Tokenizer
from tests.support.tiers import tier_of

# The oracle must never try to reach the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Tests run services on the public development defaults (cache secret, no cachemeta token);
# the tests of the production rules set CRESCENT_DEV_MODE=false themselves.
os.environ.setdefault("CRESCENT_DEV_MODE", "true")

REPO_ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks each test with its tier (``tests/support/tiers.py``), so ``-m`` picks one."""
    for item in items:
        item.add_marker(tier_of(Path(item.path)))


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    """Shared across runs so the one-time GGUF conversion is paid once."""
    env = os.environ.get("CRESCENT_CACHE_DIR")
    return Path(env) if env else REPO_ROOT / ".crescent" / "cache"


@pytest.fixture(scope="session")
def model_files(cache_dir: Path) -> ModelFiles:
    return resolve_model(None, cache_dir)


@pytest.fixture(scope="session")
def tokenizer(model_files: ModelFiles) -> Tokenizer:
    return Tokenizer.from_dir(model_files.path)


@pytest.fixture(scope="session")
def hf_tokenizer() -> Any:
    from transformers import AutoTokenizer

    gguf = default_model_file()
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


@pytest.fixture(scope="session")
def hf_model() -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    gguf = default_model_file()
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="session")
def model(model_files: ModelFiles, cache_dir: Path) -> DecoderForCausalLM:
    """The real model as the services load it (with the CPU kernels where this machine can
    build them), loaded once per test session and shared by every engine."""
    return load_model(EngineSettings(cache_dir=cache_dir, device="cpu"), model_files)


@pytest.fixture(scope="session")
def torch_only_model(model_files: ModelFiles) -> DecoderForCausalLM:
    """The real model with every matmul torch's: the fallback where the kernels are off."""
    return load_model(EngineSettings(cpu_kernels="off", device="cpu"), model_files)


RealEngineFactory = Callable[..., LLMEngine]


@pytest.fixture(scope="session")
def grammars(tokenizer: Tokenizer, model_files: ModelFiles) -> Grammars:
    """Grammar compilation for the default model's vocabulary, as nodes build it."""
    config = model_files.config
    return Grammars(tokenizer.backend_json(), config.vocab_size, config.eos_token_ids)


@pytest.fixture(scope="session")
def make_real_engine(
    model: DecoderForCausalLM, model_files: ModelFiles, grammars: Grammars
) -> RealEngineFactory:
    """A fresh engine (its own empty KV pool and prefix cache) around the shared model."""

    def make(
        *, with_model: DecoderForCausalLM | None = None, fused_decode: bool = True, **overrides: Any
    ) -> LLMEngine:
        settings: dict[str, Any] = {
            "num_kv_blocks": 160,
            "max_model_len": model_files.config.max_position_embeddings,
            "eos_token_ids": model_files.config.eos_token_ids,
        }
        config = EngineConfig(**(settings | overrides))
        layout = KVLayout.for_model(model_files.config, config.block_size, config.kv_dtype)
        cache = PagedKVCache(layout, config.num_kv_blocks)
        runner = ModelRunner(with_model or model, cache, fused_decode)
        return LLMEngine(runner, config, model_files.config.model_id, grammars)

    return make
