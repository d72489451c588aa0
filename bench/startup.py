"""How soon a `crescent generate` process prints its first token after launch.

The first run on a machine converts the GGUF into the cache; every later run loads the
converted folder. This measures those later runs: wall time from process start to the first
byte on stdout, and to exit.

    .venv/bin/python bench/startup.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from rich.console import Console
from rich.table import Table

COMMAND = [
    sys.executable,
    "-m",
    "crescent",
    "generate",
    "--prompt",
    "The capital of France is",
    "--max-tokens",
    "8",
]


def launch_once() -> tuple[float, float]:
    start = time.perf_counter()
    proc = subprocess.Popen(COMMAND, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    first = proc.stdout.read(1)
    first_at = time.perf_counter() - start
    proc.wait()
    if proc.returncode != 0 or not first:
        raise SystemExit(
            f"crescent generate failed: {proc.stderr.read().decode() if proc.stderr else ''}"
        )
    return first_at, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description="time to first token of `crescent generate`")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    launch_once()  # converts the model into the cache if this machine has not yet
    runs = [launch_once() for _ in range(args.runs)]
    table = Table(title=f"`crescent generate` from launch ({args.runs} runs after one warm-up)")
    for col in ("measure", "median s", "max s"):
        table.add_column(col, justify="right")
    for i, name in enumerate(("first token on stdout", "process exit (8 tokens)")):
        values = [r[i] for r in runs]
        table.add_row(name, f"{statistics.median(values):.2f}", f"{max(values):.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
