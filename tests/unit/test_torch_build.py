"""``python -m crescent.torch_build``, the step of ``make install`` that picks torch's build:
CUDA where an NVIDIA GPU is seen, else CPU from PyTorch's CPU index, falling back to pip's
configured index within seconds when that index does not answer."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from crescent.torch_build import DEFAULT_CPU_INDEX, PIN, mismatch
from tests.support.pip_index import index_answering

ROOT = Path(__file__).resolve().parents[2]
UNREACHABLE = "http://127.0.0.1:9/"  # the discard port: nothing listens there


def run(
    tmp_path: Path, *args: str, gpu: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """The script in dry-run mode, with only a fake ``nvidia-smi`` (printing ``gpu``, or
    failing as it does without a device) on PATH and no GPU entries in /proc."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    if gpu is None:
        smi.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    else:
        smi.write_text(f"#!/bin/sh\necho '{gpu}'\n")
    smi.chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_")}
    proc = ["--proc-dir", str(tmp_path / "no-proc")]
    return subprocess.run(
        [sys.executable, "-m", "crescent.torch_build", "--dry-run", *proc, *args],
        env=clean | {"PATH": str(bin_dir)} | env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def pip_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if " -m pip install " in line]


@pytest.fixture
def cpu_index() -> Iterator[str]:
    """A local stand-in for PyTorch's CPU index that answers /torch/."""
    with index_answering("/whl/cpu/torch/") as url:
        yield f"{url}/whl/cpu"


def test_a_gpu_listed_by_nvidia_smi_picks_the_cuda_build(tmp_path: Path) -> None:
    gpu = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"
    done = run(tmp_path, "--cpu-index", UNREACHABLE, gpu=gpu)
    assert done.returncode == 0, done.stderr
    assert f"torch: CUDA build (NVIDIA GPU seen: {gpu})" in done.stdout
    assert [line.split(" -m ")[1] for line in pip_lines(done.stdout)] == [
        f"pip install --quiet {PIN}"
    ]


def test_the_drivers_proc_entry_alone_also_picks_cuda(tmp_path: Path) -> None:
    (tmp_path / "gpus" / "0000:01:00.0").mkdir(parents=True)
    done = run(tmp_path, "--proc-dir", str(tmp_path / "gpus"), "--cpu-index", UNREACHABLE)
    assert "torch: CUDA build (NVIDIA GPU seen:" in done.stdout, done.stdout + done.stderr
    assert "0000:01:00.0" in done.stdout


def test_without_a_gpu_an_unreachable_cpu_index_falls_back_in_seconds(tmp_path: Path) -> None:
    started = time.monotonic()
    done = run(tmp_path, "--cpu-index", UNREACHABLE)  # nvidia-smi finds no device
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert took < 10
    reason = done.stdout.splitlines()[0]
    assert reason.startswith("torch: CPU build (no NVIDIA GPU seen); PyTorch's CPU index")
    assert "http://127.0.0.1:9 unreachable (" in reason
    assert f"using pip's configured index for {PIN}" in reason
    (command,) = pip_lines(done.stdout)
    assert command.endswith(f"pip install --quiet {PIN}") and "--index-url" not in command


def test_an_index_that_never_answers_is_given_up_after_the_timeout(tmp_path: Path) -> None:
    with socket.socket() as silent:  # accepts connections (the backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        index = f"http://127.0.0.1:{silent.getsockname()[1]}/whl/cpu"
        started = time.monotonic()
        done = run(tmp_path, "--cpu-index", index, "--timeout", "1")
        took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert "unreachable (timed out in 1 s)" in done.stdout
    assert 1 <= took < 8


def test_a_reachable_cpu_index_serves_torch_alone(tmp_path: Path, cpu_index: str) -> None:
    done = run(tmp_path, "--cpu-index", cpu_index + "/")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"torch: CPU build (no NVIDIA GPU seen): {PIN} from {cpu_index}")
    first, second = (line.split(" -m ")[1] for line in pip_lines(done.stdout))
    assert first == f"pip install --quiet --no-deps --index-url {cpu_index} {PIN}"
    assert second == f"pip install --quiet {PIN}"  # its requirements: the configured index


def test_the_build_flag_overrides_what_is_seen(tmp_path: Path, cpu_index: str) -> None:
    done = run(tmp_path, "--cpu-index", cpu_index, "--build", "cpu", gpu="GPU 0: NVIDIA A10")
    assert done.stdout.startswith(f"torch: CPU build (TORCH_BUILD=cpu): {PIN} from {cpu_index}")
    done = run(tmp_path, "--cpu-index", cpu_index, "--build", "cuda")
    assert done.stdout.startswith("torch: CUDA build (TORCH_BUILD=cuda)")
    assert "--index-url" not in done.stdout


def test_only_the_flags_choose_not_the_environment(tmp_path: Path, cpu_index: str) -> None:
    # make and the Dockerfile pass TORCH_BUILD and TORCH_CPU_INDEX as flags.
    done = run(tmp_path, "--cpu-index", cpu_index, TORCH_BUILD="cuda", TORCH_CPU_INDEX=UNREACHABLE)
    assert done.stdout.startswith(f"torch: CPU build (no NVIDIA GPU seen): {PIN} from {cpu_index}")


def test_strict_fails_rather_than_fall_back_and_a_bad_build_is_refused(tmp_path: Path) -> None:
    done = run(tmp_path, "--build", "cpu", "--strict", "--cpu-index", UNREACHABLE)
    assert done.returncode == 1
    assert "unreachable" in done.stderr and not pip_lines(done.stdout)
    done = run(tmp_path, "--build", "gpu")
    assert done.returncode == 2
    assert "TORCH_BUILD='gpu': expected one of auto, cpu, cuda" in done.stderr


def test_the_installed_build_is_checked_against_the_one_wanted() -> None:
    assert mismatch("cpu", "2.13.0+cpu", None) is None
    assert mismatch("cuda", "2.13.0", "13.0") is None
    warning = mismatch("cuda", "2.13.0+cpu", None)
    assert warning and "wanted the CUDA build" in warning and "2.13.0+cpu" in warning
    assert mismatch("cpu", "2.13.0", "13.0")


def test_make_install_passes_the_pin_and_its_overrides() -> None:
    pinned = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert PIN in pinned
    stamp = ".venv/.crescent-installed"
    overrides = ("TORCH_BUILD=cuda", "TORCH_CPU_INDEX=http://mirror.example/cpu")
    for args, build, index in (
        ((), "auto", DEFAULT_CPU_INDEX),
        (overrides, "cuda", "http://mirror.example/cpu"),
    ):
        done = subprocess.run(
            ["make", "-n", "-B", *args, stamp],
            env={k: v for k, v in os.environ.items() if not k.startswith("TORCH_")},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        expected = f"-m crescent.torch_build {PIN} --build {build} --cpu-index {index}"
        assert re.search(rf"\S+/python {re.escape(expected)}$", done.stdout, re.M), done.stdout
