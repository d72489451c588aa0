"""The Dockerfile's two images, checked without an engine: TORCH_BUILD=cpu (the default, and
what docker-compose.yml builds) takes torch from PyTorch's CPU index and fails rather than fall
back; TORCH_BUILD=cuda takes PyPI's CUDA build. The Dockerfile's own torch command is run in
dry-run mode for each."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from crescent.torch_build import DEFAULT_CPU_INDEX, PIN
from tests.deploy.test_compose import rendered
from tests.support.pip_index import index_answering

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
UNREACHABLE = "http://127.0.0.1:9/"  # the discard port: nothing listens there
CRESCENT_IMAGES = (
    "secrets-init",
    "gateway",
    "cachemeta",
    "scheduler",
    "prefill",
    "decode",
    "tierd",
)


def instructions() -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = (line.strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def build_args() -> dict[str, str]:
    return dict(
        line.removeprefix("ARG ").split("=", 1)
        for line in instructions()
        if line.startswith("ARG ") and "=" in line
    )


def torch_command(**build_args: str) -> list[str]:
    """The Dockerfile's torch_build invocation, its build arguments expanded as the shell
    would; the script itself is the repository's."""
    (run,) = [line for line in instructions() if "torch_build.py" in line and line[:4] == "RUN "]
    words = shlex.split(run.removeprefix("RUN "))
    start = next(i for i, word in enumerate(words) if word.endswith("torch_build.py"))
    end = words.index("&&", start)
    args = [re.sub(r"\$\{?(\w+)\}?", lambda m: build_args[m[1]], w) for w in words[start + 1 : end]]
    return [sys.executable, str(ROOT / "crescent" / "torch_build.py"), *args]


def dry_run(**overrides: str) -> subprocess.CompletedProcess[str]:
    command = torch_command(**(build_args() | overrides))
    return subprocess.run(
        [*command, "--dry-run"],
        env={k: v for k, v in os.environ.items() if not k.startswith("TORCH_")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_default_image_is_the_cpu_one_and_torch_comes_before_the_source() -> None:
    args = build_args()
    assert args["TORCH_BUILD"] == "cpu"
    assert args["TORCH_CPU_INDEX"] == DEFAULT_CPU_INDEX
    command = torch_command(**args)
    assert PIN in command and "--strict" in command
    order = instructions()
    torch_at = next(i for i, line in enumerate(order) if "torch_build.py torch==" in line)
    assert torch_at < order.index("COPY shared ./shared")


def test_the_cpu_image_takes_torch_from_the_cpu_index() -> None:
    with index_answering("/whl/cpu/torch/") as url:
        cpu_index = f"{url}/whl/cpu"
        done = dry_run(TORCH_CPU_INDEX=cpu_index)
    assert done.returncode == 0, done.stderr
    assert f"torch: CPU build (TORCH_BUILD=cpu): {PIN} from {cpu_index}" in done.stdout
    assert f"--no-deps --index-url {cpu_index} {PIN}" in done.stdout


def test_the_cpu_image_fails_rather_than_take_another_build() -> None:
    done = dry_run(TORCH_CPU_INDEX=UNREACHABLE)
    assert done.returncode == 1
    assert "unreachable" in done.stderr and "pip install" not in done.stdout


def test_the_cuda_image_takes_the_cuda_build() -> None:
    done = dry_run(TORCH_BUILD="cuda", TORCH_CPU_INDEX=UNREACHABLE)
    assert done.returncode == 0, done.stderr
    assert "torch: CUDA build (TORCH_BUILD=cuda)" in done.stdout
    assert done.stdout.rstrip().endswith(f"pip install --quiet {PIN}")
    assert "ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility" in instructions()


@pytest.mark.parametrize("bad", ["gpu", ""])
def test_an_unknown_torch_build_fails_the_image(bad: str) -> None:
    assert dry_run(TORCH_BUILD=bad).returncode != 0


def test_compose_builds_the_cpu_image_for_every_crescent_service() -> None:
    services = rendered()["services"]
    for name in CRESCENT_IMAGES:
        build = services[name]["build"]
        assert build["args"] == {"TORCH_BUILD": "cpu"}, name
        assert Path(build["context"]) / build["dockerfile"] == DOCKERFILE
