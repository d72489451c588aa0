"""Session fixtures: the converted default model, our tokenizer and the transformers oracle."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from shared.model.loader import ModelFiles, default_model_file, resolve_model
from shared.model.tokenizer import Tokenizer

# The oracle must never try to reach the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO_ROOT = Path(__file__).resolve().parents[2]


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
