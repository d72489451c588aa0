"""`ggml_matmul` over each ggml format at the shape of one layer of a real model.

One pass multiplies an M-row input by a layer's projections (q/k/v fused, o, gate/up fused,
down) stored as random blocks of one format, as a decode step at batch M does; the figure is
the best pass of several, with the bytes of blocks it read per second. The default shape is a
1B Llama's layer (hidden 2048, 32 heads, 8 KV heads, intermediate 8192); `--hidden 4096
--kv 1024 --intermediate 14336` is an 8B's.

    .venv/bin/python bench/ggml_formats.py [--types Q4_K Q6_K] [--rows 1 4 16] [--threads 2]
"""

from __future__ import annotations

import argparse

import torch
from ggml_gemm import best_pass_ms  # bench/ is first on sys.path
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from rich.console import Console
from rich.table import Table

from shared.config import EngineSettings
from shared.model import cpu_kernels

DEFAULT_TYPES = ["Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]


def layer_shapes(hidden: int, kv: int, intermediate: int) -> list[tuple[int, int]]:
    """(out, in) of each projection: qkv, o, gate/up, down."""
    return [(hidden + 2 * kv, hidden), (hidden, hidden), (2 * intermediate, hidden),
            (hidden, intermediate)]  # fmt: skip


def random_blocks(qtype: GGMLQuantizationType, out: int, k: int) -> torch.Tensor:
    weights, nbytes = GGML_QUANT_SIZES[qtype]
    # Zero bytes make every scale 0.0: the kernel's work does not depend on the values.
    return torch.zeros(out, k // weights * nbytes, dtype=torch.uint8)


def pass_ms(qtype: int, mats: list[tuple[torch.Tensor, int]], m: int, passes: int) -> float:
    """The best of ``passes`` passes of an ``m``-row input through every matrix."""
    xs = [torch.randn(m, k) for _, k in mats]

    def one_pass() -> None:
        for (blocks, k), x in zip(mats, xs, strict=True):
            torch.ops.crescent.ggml_matmul(x, blocks, qtype, k)

    return best_pass_ms(one_pass, passes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", nargs="+", default=DEFAULT_TYPES)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--kv", type=int, default=512)
    parser.add_argument("--intermediate", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--passes", type=int, default=10)
    args = parser.parse_args()
    if not cpu_kernels.load(EngineSettings(device="cpu").cache_dir):
        raise SystemExit("the CPU kernels are not available on this machine (see the log)")
    torch.set_num_threads(args.threads)
    shapes = layer_shapes(args.hidden, args.kv, args.intermediate)
    table = Table(title=f"one layer {shapes}, {args.threads} threads, best of {args.passes}")
    for col in ("type", "MB", *(f"M={m} ms (GB/s)" for m in args.rows)):
        table.add_column(col, justify="right")
    for name in args.types:
        qtype = GGMLQuantizationType[name]
        mats = [(random_blocks(qtype, out, k), k) for out, k in shapes]
        nbytes = sum(blocks.numel() for blocks, _ in mats)
        cells = []
        for m in args.rows:
            ms = pass_ms(int(qtype), mats, m, args.passes)
            cells.append(f"{ms:.2f} ({nbytes / ms / 1e6:.1f})")
        table.add_row(name, f"{nbytes / 2**20:.1f}", *cells)
    Console().print(table)


if __name__ == "__main__":
    main()
