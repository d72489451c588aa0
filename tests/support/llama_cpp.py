"""llama.cpp's own ``convert_hf_to_gguf.py``, to write GGUF files of the tiny test models.

The converter ships in the llama-cpp-python source package (not in any wheel): it is downloaded
once with pip into ``<cache_dir>/llama-cpp/`` and only the converter, its ``conversion``
package, its own ``gguf-py`` (often newer than the installed ``gguf``) and the chat templates
some converters read are unpacked beside it. Conversions run in a subprocess with that
``gguf-py`` first on ``sys.path``, exactly as the script arranges for itself, and with one
change (``_RUNNER``): a BPE vocabulary llama.cpp does not know can be given its pre-tokenizer.

A GGUF file means its tiny model except where llama.cpp cannot carry a setting: then it means
the model with llama.cpp's own value for it (``GGUF_DROPS``, ``gguf_reference_folder``), and
Qwen3-MoE's file is written from an all-sparse variant (``GGUF_SOURCES``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from shared.model.files import build_folder_once
from tests.support.tiny_models import tiny_model_folder

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
# Inside the sdist, llama.cpp itself lives here.
_VENDOR = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
# What the converter reads from its source tree: itself, its per-family modules, its gguf
# package and the templates a few families embed.
_MEMBERS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/gguf/", "models/templates/")
# Part of every cached GGUF's name: bump it when a conversion setting below changes.
TINY_GGUF_VERSION = 1


def converter_dir(cache_dir: Path) -> Path:
    """The unpacked converter, downloaded and unpacked on first use."""
    target = cache_dir / "llama-cpp" / f"llama.cpp-{LLAMA_CPP_PYTHON_VERSION}"
    if (target / "convert_hf_to_gguf.py").is_file():
        return target
    sdist = sdist_path(cache_dir)
    return build_folder_once(target, lambda tmp: _extract(sdist, tmp), "convert_hf_to_gguf.py")


def sdist_path(cache_dir: Path) -> Path:
    """llama-cpp-python's source package, downloaded with pip on first use."""
    root = cache_dir / "llama-cpp"
    root.mkdir(parents=True, exist_ok=True)
    sdist = root / SDIST
    if not sdist.is_file():
        _download(root)
    return sdist


def _download(root: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=".download.", dir=root))
    try:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--progress-bar",
                "off",
                f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
                "-d",
                str(tmp),
            ],
            check=True,
            capture_output=True,
            timeout=900,
        )
        os.replace(tmp / SDIST, root / SDIST)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _extract(sdist: Path, out: Path) -> None:
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar:
            if not member.name.startswith(_VENDOR):
                continue
            relative = member.name[len(_VENDOR) :]
            if not relative.startswith(_MEMBERS) or not member.isfile():
                continue
            if "/tests/" in f"/{relative}" or "__pycache__" in relative:
                continue
            source = tar.extractfile(member)
            if source is None:
                continue
            path = out / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            with source, path.open("wb") as f:
                shutil.copyfileobj(source, f)


# Runs the converter with one change: a BPE tokenizer whose fingerprint (the ids of a probe
# text) is not in llama.cpp's table of known tokenizers gets the pre-tokenizer named in
# $CRESCENT_GGUF_PRE_TOKENIZER instead of an error. The tiny models pair known pre-tokenizers
# with SmolLM2's vocabulary, which no table lists.
_RUNNER = """
import os, runpy, sys
script = sys.argv[1]
sys.path.insert(0, os.path.dirname(script))
import conversion.base as base
known = base.TextModel.get_vocab_base_pre
def get_vocab_base_pre(self, tokenizer):
    try:
        return known(self, tokenizer)
    except NotImplementedError:
        name = os.environ.get("CRESCENT_GGUF_PRE_TOKENIZER")
        if not name:
            raise
        return name
base.TextModel.get_vocab_base_pre = get_vocab_base_pre
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
"""
# Qwen2's tokenizer in transformers splits text with Qwen2's own regex, which is llama.cpp's
# "qwen2" pre-tokenizer.
_PRE_TOKENIZERS = {"qwen2": "qwen2"}
# llama.cpp's qwen3moe has no dense layers, so the GGUF of "qwen3-moe" is written from its
# all-sparse variant.
GGUF_SOURCES = {"qwen3-moe": "qwen3-moe-sparse"}


def default_cache_dir() -> Path:
    """The tests' cache: ``$CRESCENT_CACHE_DIR``, else ``.crescent/cache`` in the repository."""
    env = os.environ.get("CRESCENT_CACHE_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / ".crescent" / "cache"


def convert_to_gguf(
    folder: Path,
    out: Path,
    outtype: str = "f32",
    *,
    cache_dir: Path | None = None,
    pre_tokenizer: str | None = None,
    flags: tuple[str, ...] = (),
) -> Path:
    """Runs llama.cpp's converter on the Hugging Face folder ``folder``, writing ``out``;
    ``pre_tokenizer`` names the BPE pre-tokenizer where llama.cpp cannot recognize it, and
    ``flags`` are more of the converter's options (``--fuse-qkv``)."""
    script = converter_dir(cache_dir or default_cache_dir()) / "convert_hf_to_gguf.py"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    # Without this variable the converter puts its own gguf-py ahead of the installed gguf.
    env.pop("NO_LOCAL_GGUF", None)
    env.pop("CRESCENT_GGUF_PRE_TOKENIZER", None)
    if pre_tokenizer:
        env["CRESCENT_GGUF_PRE_TOKENIZER"] = pre_tokenizer
    command = [sys.executable, "-c", _RUNNER, str(script), str(folder), "--outfile", str(out)]
    command += ["--outtype", outtype, *flags]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(
            f"convert_hf_to_gguf.py failed on {folder} ({result.returncode}):\n"
            + result.stderr[-4000:]
        )
    return out


def tiny_gguf_file(
    name: str, cache_dir: Path, outtype: str = "f32", flags: tuple[str, ...] = ()
) -> Path:
    """The GGUF file llama.cpp's converter writes from tiny model ``name`` (from its variant
    in ``GGUF_SOURCES`` where llama.cpp cannot hold the family's own), cached."""
    source = GGUF_SOURCES.get(name, name)
    folder = tiny_model_folder(source, cache_dir)
    root = cache_dir / "tiny-gguf"
    options = "".join(flag.replace("--", "-") for flag in flags)
    target = root / f"{folder.name}-g{TINY_GGUF_VERSION}{options}.{outtype}.gguf"
    if target.is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=root)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        pre = _PRE_TOKENIZERS.get(source)
        convert_to_gguf(folder, tmp, outtype, cache_dir=cache_dir, pre_tokenizer=pre, flags=flags)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


# What llama.cpp's converter drops from a family's config.json, and the value llama.cpp's own
# runtime then uses in its place: a GGUF of the family means the tiny model with these changes.
# Mistral's and dynamic rope's settings are not written for the llama architecture, and
# llama.cpp derives Gemma's attention scale from the head size (except for the 27B layer count).
GGUF_DROPS: dict[str, dict[str, object]] = {
    "mistral": {"sliding_window": None},
    "llama-dynamic": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
    "gemma2": {"query_pre_attn_scalar": 16},
    "gemma3": {"query_pre_attn_scalar": 16},
}


def gguf_reference_folder(name: str, cache_dir: Path) -> Path:
    """The Hugging Face folder ``tiny_gguf_file(name)`` means: the folder it was written from,
    or, where the GGUF cannot carry a setting (``GGUF_DROPS``), a copy of it with that setting
    as llama.cpp runs it (weights and tokenizer linked, not copied)."""
    folder = tiny_model_folder(GGUF_SOURCES.get(name, name), cache_dir)
    changes = GGUF_DROPS.get(name)
    if not changes:
        return folder
    target = cache_dir / "tiny-gguf" / f"{folder.name}-g{TINY_GGUF_VERSION}-reference"

    def write(tmp: Path) -> None:
        for path in folder.iterdir():
            if path.name != "config.json":
                os.symlink(path, tmp / path.name)
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        config.update(changes)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")

    return build_folder_once(target, write)
