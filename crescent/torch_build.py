"""Installs torch in the build that fits this machine. ``make install`` runs it with the virtual
environment's Python before the project is installed, and the Dockerfile runs it as a plain
file, so it uses the standard library only.

- ``auto`` (the default): the CUDA build where an NVIDIA GPU is seen (``nvidia-smi -L`` lists
  one, or ``/proc/driver/nvidia/gpus`` has entries), otherwise the CPU build.
- CUDA build: the plain pin from pip's configured index; PyPI's Linux x86-64 wheel of
  torch 2.13.0 is the CUDA build (its CUDA 13.0 libraries come as nvidia-* wheels).
- CPU build: torch alone from PyTorch's CPU index (``--cpu-index``), then its pure-Python
  requirements from pip's configured index. When the CPU index does not answer within
  ``--timeout`` seconds, the plain pin from pip's configured index instead, saying so
  (``--strict``: fail instead).

It prints the build chosen and why, then the build installed; ``--dry-run`` prints the pip
commands instead of running them.
"""

from __future__ import annotations

import argparse
import platform
import shlex
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PIN = "torch==2.13.0"
BUILDS = ("auto", "cpu", "cuda")
DEFAULT_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
NVIDIA_PROC = Path("/proc/driver/nvidia/gpus")
CONFIGURED = "pip's configured index"


class Unavailable(RuntimeError):
    """The build asked for cannot be installed as asked (``--strict``)."""


@dataclass(frozen=True, slots=True)
class Choice:
    build: str  # "cpu" or "cuda": the build wanted
    reason: str  # one line: what was chosen, why, and from where
    commands: list[list[str]]  # the pip commands that install it, in order


def gpu_seen(proc_dir: Path = NVIDIA_PROC) -> str | None:
    """What shows an NVIDIA GPU here (the first GPU line of ``nvidia-smi -L``, or the driver's
    /proc entry), or None."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            done = subprocess.run(
                [smi, "-L"], capture_output=True, text=True, timeout=10, check=False
            )
            lines = done.stdout.splitlines() if done.returncode == 0 else []
        except (OSError, subprocess.TimeoutExpired):
            lines = []
        gpus = [line.strip() for line in lines if line.startswith("GPU ")]
        if gpus:
            return gpus[0]
    try:
        entries = sorted(p.name for p in proc_dir.iterdir())
    except OSError:
        entries = []
    return f"{proc_dir}/{entries[0]}" if entries else None


def probe(url: str, timeout: float) -> str | None:
    """None when ``url`` answers with a success within ``timeout`` seconds in all (name
    lookup included), else why not."""
    outcome: list[str | None] = []

    def ask() -> None:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                status = getattr(response, "status", None) or 200
                outcome.append(None if status < 400 else f"HTTP {status}")
        except urllib.error.HTTPError as e:
            outcome.append(f"HTTP {e.code}")
        except (urllib.error.URLError, OSError, ValueError) as e:
            why = str(getattr(e, "reason", e))
            outcome.append(f"timed out in {timeout:g} s" if "timed out" in why else why)

    # In a thread, so that a hanging name lookup is bounded too (urlopen's timeout is not).
    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(timeout)
    return outcome[0] if outcome else f"timed out in {timeout:g} s"


def pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", "install", "--quiet", *args]


def choose(
    build: str,
    cpu_index: str,
    *,
    timeout: float = 3.0,
    strict: bool = False,
    proc_dir: Path = NVIDIA_PROC,
    pin: str = PIN,
) -> Choice:
    """The build to install, why, and the pip commands that install it."""
    if build not in BUILDS:
        raise ValueError(f"TORCH_BUILD={build!r}: expected one of {', '.join(BUILDS)}")
    plain = [pip(pin)]
    if build == "cuda":
        return Choice("cuda", f"CUDA build (TORCH_BUILD=cuda): {pin} from {CONFIGURED}", plain)
    why = "TORCH_BUILD=cpu"
    if build == "auto":
        gpu = gpu_seen(proc_dir)
        if gpu:
            return Choice(
                "cuda", f"CUDA build (NVIDIA GPU seen: {gpu}): {pin} from {CONFIGURED}", plain
            )
        why = "no NVIDIA GPU seen"
        if platform.system() != "Linux":
            why += f"; PyPI's {platform.system()} wheels are CPU builds"
            return Choice("cpu", f"CPU build ({why}): {pin} from {CONFIGURED}", plain)
    index = cpu_index.rstrip("/")
    failure = probe(f"{index}/torch/", timeout)
    if failure is None:
        # torch alone from the CPU index; its requirements then from the configured index.
        commands = [pip("--no-deps", "--index-url", index, pin), pip(pin)]
        return Choice("cpu", f"CPU build ({why}): {pin} from {index}", commands)
    unreachable = f"CPU build ({why}); PyTorch's CPU index {index} unreachable ({failure})"
    if strict:
        raise Unavailable(unreachable)
    fallback = f"using {CONFIGURED} for {pin} (from PyPI itself, on Linux x86-64: the CUDA build)"
    return Choice("cpu", f"{unreachable}: {fallback}", plain)


def installed() -> tuple[str, str | None]:
    """The version and CUDA version of the torch this Python imports."""
    code = "import torch; print(torch.__version__, torch.version.cuda)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    version, cuda = done.stdout.split()
    return version, None if cuda == "None" else cuda


def mismatch(build: str, version: str, cuda: str | None) -> str | None:
    """Why the installed torch is not the build wanted (an index or a local wheel served the
    other one, or the environment already had it), or None."""
    if (cuda is None) == (build == "cpu"):
        return None
    return (
        f"wanted the {build.upper()} build, but pip installed or kept {version}; "
        f"`{sys.executable} -m pip uninstall -y torch`, then install again "
        "(TORCH_BUILD=cpu|cuda chooses)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m crescent.torch_build", description=__doc__)
    parser.add_argument("pin", nargs="?", default=PIN, help=f"the requirement (default {PIN})")
    # make and the Dockerfile pass their TORCH_BUILD and TORCH_CPU_INDEX as these flags.
    parser.add_argument("--build", default="auto", help="auto, cpu or cuda (TORCH_BUILD)")
    parser.add_argument("--cpu-index", default=DEFAULT_CPU_INDEX, help="PyTorch's CPU index")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds for the CPU index")
    parser.add_argument("--strict", action="store_true", help="fail rather than fall back")
    parser.add_argument("--dry-run", action="store_true", help="print the pip commands only")
    parser.add_argument("--proc-dir", type=Path, default=NVIDIA_PROC, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        choice = choose(
            args.build,
            args.cpu_index,
            timeout=args.timeout,
            strict=args.strict,
            proc_dir=args.proc_dir,
            pin=args.pin,
        )
    except ValueError as e:
        parser.error(str(e))
    except Unavailable as e:
        print(f"torch: {e}", file=sys.stderr)
        return 1
    print(f"torch: {choice.reason}", flush=True)
    for command in choice.commands:
        print(shlex.join(command), flush=True)
        if args.dry_run:
            continue
        started = time.monotonic()
        if subprocess.run(command, check=False).returncode != 0:
            return 1
        print(f"torch: done in {time.monotonic() - started:.0f} s", flush=True)
    if args.dry_run:
        return 0
    version, cuda = installed()
    print(f"torch: installed {version}, CUDA {cuda or 'none (CPU build)'}")
    warning = mismatch(choice.build, version, cuda)
    if warning:
        print(f"torch: {'error' if args.strict else 'warning'}: {warning}", file=sys.stderr)
        return 1 if args.strict else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
