"""Crescent's engine against Hugging Face transformers on the same model, side by side.

Prefill: time to the first token of one prompt of 128 / 512 / 2048 random tokens, fresh tokens
each run so nothing is reused. Decode: steady-state tokens/s of B sequences with 128-token
prompts decoding together, after every side has warmed up. transformers runs its fastest plain
loop: forward with a DynamicCache and logits for the last position only, greedy argmax, no
generate() bookkeeping. A third column runs Crescent with its CPU kernels off (every matmul
torch's, on the fp32 weights), which shows what the kernels add.

The sides take turns within each workload, run after run, and each figure is the median of its
side's runs: drift in a shared machine's speed then lands on every side alike.

    .venv/bin/python bench/engine.py [--runs 5] [--steps 32] [--crescent-only] [--json FILE]

``--crescent-only`` measures the served configuration alone (what ``bench/revisions.py``
compares between two revisions); ``--json`` writes every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
from rich.console import Console
from rich.table import Table

from shared.config import EngineSettings
from shared.engine.engine import LLMEngine
from shared.engine.factory import load_engine
from shared.model.files import default_model_file
from shared.sampling_params import SamplingParams

PREFILL_LENGTHS = (128, 512, 2048)
DECODE_BATCHES = (1, 8, 32)
DECODE_PROMPT = 128


def random_prompt(gen: torch.Generator, n: int) -> list[int]:
    return torch.randint(100, 40000, (n,), generator=gen).tolist()


def seconds(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved_medians(fns: list[Callable[[], float]], runs: int) -> list[float]:
    """Runs each measurement once per round, ``runs`` rounds; the median of each."""
    results: list[list[float]] = [[] for _ in fns]
    for _ in range(runs):
        for out, fn in zip(results, fns, strict=True):
            out.append(fn())
    return [statistics.median(r) for r in results]


class CrescentSide:
    def __init__(self, cpu_kernels: Literal["auto", "off"] = "auto") -> None:
        settings = EngineSettings(
            kv_cache_mb=2048, max_num_batched_tokens=2048, cpu_kernels=cpu_kernels
        )
        self.engine: LLMEngine = load_engine(settings).engine
        # A long-running server has touched its whole KV pool; first-touch page faults of a
        # fresh process (slow on some VMs) are start-up cost, not engine speed.
        self.engine.runner.cache.tensor.fill_(0)
        self.gen = torch.Generator().manual_seed(1)
        self.n = 0

    def prefill(self, length: int) -> None:
        self.n += 1
        self.engine.add_request(
            f"p{self.n}",
            random_prompt(self.gen, length),
            SamplingParams(max_tokens=1, temperature=0.0),
        )
        while self.engine.has_unfinished_requests():
            self.engine.step()

    def decode_tokens_per_s(self, batch: int, steps: int) -> float:
        params = SamplingParams(max_tokens=steps + 4, temperature=0.0, ignore_eos=True)
        for _ in range(batch):
            self.n += 1
            self.engine.add_request(f"d{self.n}", random_prompt(self.gen, DECODE_PROMPT), params)
        while self.engine.stats.steps == 0 or self.engine.scheduler.waiting:
            self.engine.step()
        for _ in range(2):
            self.engine.step()
        start = time.perf_counter()
        produced = sum(len(self.engine.step()) for _ in range(steps))
        elapsed = time.perf_counter() - start
        while self.engine.has_unfinished_requests():
            self.engine.step()
        return produced / elapsed


class TransformersSide:
    def __init__(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoModelForCausalLM

        gguf = default_model_file()
        self.model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        ).eval()
        self.gen = torch.Generator().manual_seed(2)

    def _forward(self, ids: torch.Tensor, cache: Any) -> Any:
        return self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)

    @torch.inference_mode()
    def prefill(self, length: int) -> None:
        from transformers import DynamicCache

        ids = torch.tensor([random_prompt(self.gen, length)])
        self._forward(ids, DynamicCache(config=self.model.config)).logits[:, -1].argmax(-1)

    @torch.inference_mode()
    def decode_tokens_per_s(self, batch: int, steps: int) -> float:
        from transformers import DynamicCache

        ids = torch.tensor([random_prompt(self.gen, DECODE_PROMPT) for _ in range(batch)])
        cache = DynamicCache(config=self.model.config)
        out = self._forward(ids, cache)
        next_ids = out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(2):
            next_ids = self._forward(next_ids, cache).logits[:, -1].argmax(-1, keepdim=True)
        start = time.perf_counter()
        for _ in range(steps):
            next_ids = self._forward(next_ids, cache).logits[:, -1].argmax(-1, keepdim=True)
        return batch * steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--crescent-only", action="store_true", help="no other sides")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()
    console = Console()
    console.print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32, CPU")
    sides: list[Any] = [CrescentSide()]
    names = ["Crescent"]
    if not args.crescent_only:
        sides += [CrescentSide(cpu_kernels="off"), TransformersSide()]
        names += ["kernels off", "transformers"]
    table = Table(title="Crescent engine vs transformers (SmolLM2-135M-Instruct Q4_1)")
    for col in ("workload", *names, *(("ratio", "ratio, off") if len(sides) == 3 else ())):
        table.add_column(col, justify="right")
    figures: dict[str, dict[str, float]] = {}
    for n in PREFILL_LENGTHS:
        for side in sides:  # warm-up: first touches and kernel selection are not steady state
            side.prefill(n)
        times = interleaved_medians(
            [lambda side=side, n=n: seconds(lambda: side.prefill(n)) for side in sides], args.runs
        )
        rates = [n / t for t in times]
        figures[f"prefill {n} tok (tok/s)"] = dict(zip(names, rates, strict=True))
        table.add_row(f"prefill {n} tok (tok/s)", *_figures(rates, "{:.0f}"))
    for batch in DECODE_BATCHES:
        rates = interleaved_medians(
            [
                lambda side=side, batch=batch: side.decode_tokens_per_s(batch, args.steps)
                for side in sides
            ],
            max(1, (args.runs + 1) // 2),
        )
        figures[f"decode batch {batch} (tok/s)"] = dict(zip(names, rates, strict=True))
        table.add_row(f"decode batch {batch} (tok/s)", *_figures(rates, "{:.1f}"))
    console.print(table)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1))


def _figures(rates: list[float], fmt: str) -> list[str]:
    if len(rates) == 1:
        return [fmt.format(rates[0])]
    ours, off, theirs = rates
    return [
        fmt.format(ours),
        fmt.format(off),
        fmt.format(theirs),
        f"{ours / theirs:.2f}x",
        f"{off / theirs:.2f}x",
    ]


if __name__ == "__main__":
    main()
