"""Crescent's own CPU kernels: compiled once per machine into the cache, then loaded in a blink.

The kernels are C++ against torch's headers, built with the system's ``g++`` the first time a
process wants them and kept as ``<cache>/kernels/<name>-<key>.so``; the key changes with the
source, the flags and the torch version, so a stale build is never loaded. Where they cannot
be built (no compiler, no AVX-512, not Linux on x86-64) ``load`` says why and returns False, and
callers keep to torch's matmuls on the fp32 weights: the same weight values, slower decode.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from shared.model.settings import CompilerSettings

log = logging.getLogger(__name__)

_HERE = Path(__file__).parent
# Compiled together into one library; the headers are part of its cache key.
SOURCES = tuple(_HERE / name for name in ("ggml_weights.cpp", "decode_step.cpp", "decode_job.cpp"))
HEADERS = tuple(sorted(_HERE.glob("*.h")))
# -ffp-contract=off: the expansion of quantized weights must round a multiply and an add
# separately, as the reference dequantizer does; the kernel spells out its own FMAs.
CXXFLAGS = (
    "-O3",
    "-std=gnu++20",
    "-shared",
    "-fPIC",
    "-fopenmp",
    "-ffp-contract=off",
    "-mavx512f",
    "-mavx512bw",
    "-mavx512vl",
    "-mavx512dq",
    "-mfma",
    "-mf16c",
)
COMPILE_TIMEOUT_S = 600


@functools.cache
def _cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def compile_flags() -> tuple[str, ...]:
    """CXXFLAGS, plus VNNI where this CPU has it: the integer dot products of the K-quants
    (ggml_intdot.h) take one instruction per 32 weights with it, two without."""
    return CXXFLAGS + (("-mavx512vnni",) if "avx512_vnni" in _cpu_flags() else ())


_loaded: bool | None = None


def load(cache_dir: Path) -> bool:
    """Makes ``torch.ops.crescent`` available in this process; False (logged) where it cannot."""
    global _loaded
    if _loaded is None:
        reason = _unsupported_reason()
        # A machine the kernels do not support takes the torch path, which computes the same
        # results, only slower: not worth a warning on every start (a CLI's stderr stays one
        # line per error). A build that failed where they should work is.
        level = logging.INFO
        if reason is None:
            try:
                torch.ops.load_library(str(_built_library(cache_dir)))
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                reason, level = f"building them failed: {exc}", logging.WARNING
        if reason is not None:
            log.log(level, "CPU kernels off, torch matmuls used instead: %s", reason)
        _loaded = reason is None
    return _loaded


def _unsupported_reason() -> str | None:
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"they are built for Linux on x86-64, not {sys.platform} on {platform.machine()}"
    if not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        return "this CPU lacks AVX-512"
    if shutil.which(_compiler()) is None:
        return f"no C++ compiler {_compiler()!r} on PATH (set CXX to use another)"
    return None


def _compiler() -> str:
    return CompilerSettings().compiler()


def _torch_dirs() -> tuple[Path, Path]:
    root = Path(torch.__file__).parent
    return root / "include", root / "lib"


def _command(output: Path) -> list[str]:
    include, lib = _torch_dirs()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [
        _compiler(),
        *compile_flags(),
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f"-I{include}",
        *(str(source) for source in SOURCES),
        f"-L{lib}",
        "-lc10",
        "-ltorch_cpu",
        "-o",
        str(output),
    ]


def library_path(cache_dir: Path) -> Path:
    """Where the build for this source, these flags and this torch lives in the cache."""
    digest = hashlib.sha256()
    for path in (*SOURCES, *HEADERS):
        digest.update(path.read_bytes())
    digest.update("\0".join((*compile_flags(), _compiler(), torch.__version__)).encode())
    return cache_dir / "kernels" / f"crescent-{digest.hexdigest()[:16]}.so"


def _built_library(cache_dir: Path) -> Path:
    target = library_path(cache_dir)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Services starting together on one machine build once; the others wait and load it.
    with (target.parent / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.is_file():
            _compile(target)
    return target


def _compile(target: Path) -> None:
    log.info("Building CPU kernels into %s (once per machine)", target)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.stem}.", suffix=".so", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        done = subprocess.run(
            _command(tmp), capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S
        )
        if done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if "error" in line]
            raise RuntimeError("; ".join(errors[:3]) or done.stderr[-500:])
        # mkstemp makes the file private; the cache is as readable as any other.
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
