"""The memory-bandwidth floor of a batch-1 decode step, beside the engine's step.

A batch-1 decode step multiplies one row by every weight of the model, so it cannot take less
than the bytes of weights it reads divided by the machine's memory bandwidth. This measures
the bandwidth (reading a buffer far larger than the caches, with one thread and with every
torch thread), the bytes the CPU kernels read per step (their weight blocks), one pass of
every projection at one row, and the engine's own batch-1 decode step, and prints each
against the floor.

    .venv/bin/python bench/membw.py [--gib 1] [--passes 10] [--steps 64]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.ggml_gemm import best_pass_ms
from shared.config import EngineSettings
from shared.engine.factory import load_engine
from shared.model.layers import Linear
from shared.sampling_params import SamplingParams


def read_bandwidth(gib: float, threads: int, passes: int) -> float:
    """Bytes/s of summing a float32 buffer of ``gib`` GiB with ``threads`` torch threads."""
    buffer = torch.ones(int(gib * 2**30) // 4)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)

    def total() -> None:
        buffer.sum()

    try:
        seconds = best_pass_ms(total, passes) / 1e3
    finally:
        torch.set_num_threads(before)
    return buffer.numel() * 4 / seconds


def decode_step_s(steps: int) -> tuple[float, int, Callable[[], None] | None]:
    """The engine's median batch-1 decode step, the weight block bytes its kernels read, and
    one pass of those projections at one row (None without the kernels)."""
    engine = load_engine(EngineSettings()).engine
    params = SamplingParams(max_tokens=steps + 1, temperature=0.0, ignore_eos=True)
    # Once unmeasured, as in a server that has been running: the pool's pages are touched and
    # the kernels' first calls are done.
    engine.generate([list(range(2000, 2128))], params)
    engine.add_request("r", list(range(1000, 1128)), params)
    engine.step()  # the prefill
    times = []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    model = engine.runner.model
    packed = [m.ggml for m in model.modules() if isinstance(m, Linear) and m.ggml is not None]
    weight_bytes = sum(p.blocks.numel() for w in packed for p in w.parts)
    one_pass = None
    if packed:
        inputs = [torch.randn(1, w.in_features) for w in packed]

        def run_pass() -> None:
            with torch.inference_mode():
                for w, x in zip(packed, inputs, strict=True):
                    w(x)

        one_pass = run_pass
    return statistics.median(times), weight_bytes, one_pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the buffer read")
    parser.add_argument("--passes", type=int, default=10)
    parser.add_argument("--steps", type=int, default=64, help="decode steps timed")
    args = parser.parse_args()
    step, weight_bytes, one_pass = decode_step_s(args.steps)
    threads = torch.get_num_threads()
    bandwidths = {n: read_bandwidth(args.gib, n, args.passes) for n in sorted({1, threads})}
    best = max(bandwidths.values())
    floor = weight_bytes / best
    table = Table(title=f"batch-1 decode against the memory floor ({weight_bytes / 1e6:.1f} MB)")
    for col in ("figure", "value", "÷ floor"):
        table.add_column(col, justify="right")
    for n, bw in bandwidths.items():
        table.add_row(f"read bandwidth, {n} thread(s)", f"{bw / 1e9:.1f} GB/s", "")
    table.add_row("floor: weight bytes ÷ best bandwidth", f"{floor * 1e3:.2f} ms", "1.00×")
    if one_pass is not None:
        projections = best_pass_ms(one_pass, args.passes) / 1e3
        table.add_row("one pass of the projections, 1 row", f"{projections * 1e3:.2f} ms",
                      f"{projections / floor:.2f}×")  # fmt: skip
    table.add_row("engine decode step, batch 1", f"{step * 1e3:.2f} ms", f"{step / floor:.2f}×")
    Console(width=100).print(table)


if __name__ == "__main__":
    main()
