"""llama.cpp's own tools, built once from the llama-cpp-python source package.

``llama-quantize`` re-quantizes a test model as a user's file would be (the K-quant types are
written by no Python package), and ``llama-server`` is the peer of ``bench/peer.py``. The
whole llama.cpp tree of the source package is unpacked into ``<cache>/llama-cpp/src-<version>``
and built there with cmake (a few minutes on 2 cores, once per machine; ``make test`` does it
before the tests run). Only the targets asked for are built.

    python -m tests.support.llama_build [TARGET ...]   # default: llama-quantize
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path

from shared.model.files import build_folder_once
from tests.support.llama_cpp import LLAMA_CPP_PYTHON_VERSION, default_cache_dir, sdist_path

_VENDOR = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
# The CPU's own instruction sets, AMX left out: ggml's AMX matmul crashes (SIGSEGV) in VMs
# whose hypervisor lists the AMX flags without granting the tiles, as on the development VM;
# ``-march=native`` (GGML_NATIVE) would turn it on wherever the flag shows.
_CPU_FEATURES = {
    "avx512f": "GGML_AVX512",
    "avx512vbmi": "GGML_AVX512_VBMI",
    "avx512_vnni": "GGML_AVX512_VNNI",
    "avx512_bf16": "GGML_AVX512_BF16",
    "avx_vnni": "GGML_AVX_VNNI",
}
_FLAGS = (
    "-DGGML_NATIVE=OFF",
    "-DGGML_AMX_TILE=OFF",
    "-DGGML_AMX_INT8=OFF",
    "-DGGML_AMX_BF16=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DCMAKE_BUILD_TYPE=Release",
)


def llama_cpp_build(cache_dir: Path, targets: Sequence[str] = ("llama-quantize",)) -> Path:
    """The build folder holding ``bin/<target>`` for each of ``targets``, built where absent."""
    source = cache_dir / "llama-cpp" / f"src-{LLAMA_CPP_PYTHON_VERSION}"
    build = source / "build"
    if all((build / "bin" / t).is_file() for t in targets):
        return build
    sdist = sdist_path(cache_dir)
    build_folder_once(source, lambda tmp: _unpack(sdist, tmp), "CMakeLists.txt")
    cmake = _cmake()
    print(f"building llama.cpp's {', '.join(targets)} once, in {build}", flush=True)
    flags = [*_FLAGS, *_cpu_flags()]
    subprocess.run([cmake, "-B", str(build), "-S", str(source), *flags], check=True)
    jobs = str(os.cpu_count() or 2)
    subprocess.run([cmake, "--build", str(build), "--target", *targets, "-j", jobs], check=True)
    return build


def requantized(cache_dir: Path, source: Path, qtype: str) -> Path:
    """``source`` re-quantized to ``qtype`` by ``llama-quantize`` (made once, cached)."""
    target = cache_dir / "llama-cpp" / "requantized" / f"{source.stem}.{qtype}.gguf"
    if target.is_file():
        return target
    quantize = llama_cpp_build(cache_dir) / "bin" / "llama-quantize"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    subprocess.run(
        [str(quantize), "--allow-requantize", str(source), str(partial), qtype, "2"],
        check=True,
        capture_output=True,
    )
    partial.replace(target)
    return target


def _cpu_flags() -> list[str]:
    """``-DGGML_<SET>=ON`` for each instruction set this CPU lists (AVX, AVX2, FMA, F16C and
    BMI2 are on by default)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    have = set(line.split(":", 1)[-1].split())
    return [f"-D{option}=ON" for flag, option in _CPU_FEATURES.items() if flag in have]


def _cmake() -> str:
    """The system's cmake, else the one the ``cmake`` package put beside this Python."""
    found = shutil.which("cmake") or shutil.which("cmake", path=str(Path(sys.executable).parent))
    if found is None:
        raise RuntimeError("cmake is needed to build llama.cpp's tools: pip install cmake")
    return found


def _unpack(sdist: Path, out: Path) -> None:
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar:
            if not member.name.startswith(_VENDOR) or not member.isfile():
                continue
            source = tar.extractfile(member)
            if source is None:
                continue
            path = out / member.name[len(_VENDOR) :]
            path.parent.mkdir(parents=True, exist_ok=True)
            with source, path.open("wb") as f:
                shutil.copyfileobj(source, f)
            path.chmod(member.mode & 0o777 or 0o644)


if __name__ == "__main__":
    built = llama_cpp_build(default_cache_dir(), sys.argv[1:] or ("llama-quantize",))
    print(f"llama.cpp tools: {built / 'bin'}")
