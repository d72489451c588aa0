"""The CPU kernels' few-row matmuls against torch's, over every projection of the real model.

For each row count M, one pass multiplies an M-row input by every projection of the model in
order (30 layers of q/k/v, o, gate/up, down, then the vocabulary head), as one forward step
does, so the weights stream from memory as they do when serving. The kernels read the GGUF's
blocks; torch multiplies fp32 copies of the same weights (`x @ W`). The figure is the best of
several passes; the ratio is where `MAX_ROWS` comes from.

    .venv/bin/python bench/ggml_gemm.py [--rows 1 2 4 8 16 32 48 64] [--passes 10]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from rich.console import Console
from rich.table import Table

from shared.config import EngineSettings
from shared.engine.factory import load_model
from shared.model.files import resolve_model
from shared.model.layers import Linear


def best_pass_ms(fn: Callable[[], None], passes: int) -> float:
    fn()
    best = float("inf")
    for _ in range(passes):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 48, 64])
    parser.add_argument("--passes", type=int, default=10)
    args = parser.parse_args()
    settings = EngineSettings(device="cpu")
    model = load_model(settings, resolve_model(settings.model, settings.cache_dir))
    weights = [m.ggml for m in model.modules() if isinstance(m, Linear) and m.ggml is not None]
    if not weights:
        raise SystemExit("the CPU kernels are not available on this machine (see the log)")
    # torch multiplies fp32 copies, transposed as the projections kept them before.
    pairs = [(w.dequantize().t().contiguous(), w) for w in weights]
    weight_mb = sum(p.blocks.numel() for w in weights for p in w.parts) / 2**20
    table = Table(title=f"{len(pairs)} projections, one pass ({weight_mb:.0f} MB of blocks)")
    for col in ("rows", "kernels (ms)", "torch fp32 (ms)", "speed-up"):
        table.add_column(col, justify="right")
    with torch.inference_mode():
        for m in args.rows:
            inputs = [torch.randn(m, w.in_features) for w in weights]

            def kernels(inputs: list[torch.Tensor] = inputs) -> None:
                for (_, weight), x in zip(pairs, inputs, strict=True):
                    weight(x)

            def fp32(inputs: list[torch.Tensor] = inputs) -> None:
                for (copy, _), x in zip(pairs, inputs, strict=True):
                    x @ copy

            ours, theirs = best_pass_ms(kernels, args.passes), best_pass_ms(fp32, args.passes)
            table.add_row(str(m), f"{ours:.1f}", f"{theirs:.1f}", f"{theirs / ours:.2f}x")
    Console().print(table)


if __name__ == "__main__":
    main()
