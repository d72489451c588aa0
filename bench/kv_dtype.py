"""What a KV cache of bfloat16, float16 or fp8_e4m3 (CRESCENT_KV_DTYPE) costs in exactness and
gains in bytes, against the float32 cache, on one model in one run.

Loads the model once per KV dtype and decodes the same prompts greedily (fresh text prompts
from a fixed list, each extended by random token ids to ``--prompt-tokens``), then prints per
dtype: the KV bytes a token takes, how many sequences are token for token the float32 cache's,
how far the others agree before they part, and the median decode step. A greedy sequence
parts from the reference at the first near-tie the rounding of K and V tips over; after that
its tokens are another valid continuation, not noise, so the count of identical sequences and
the agreeing prefix are the figures to read.

    python bench/kv_dtype.py [--model PATH] [--prompts 16] [--prompt-tokens 256] [--tokens 64]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from rich.console import Console
from rich.table import Table

from shared.config import EngineSettings
from shared.engine.factory import load_engine
from shared.model.files import resolve_model
from shared.model.tokenizer import Tokenizer
from shared.sampling_params import SamplingParams

DTYPES = ("float32", "bfloat16", "float16", "fp8_e4m3")
OPENINGS = (
    "The history of the Roman empire is",
    "def quicksort(items):",
    "Photosynthesis converts light into",
    "In a small village by the sea, an old fisherman",
    "The three laws of thermodynamics state that",
    "To bake bread at home, first",
    "Quantum entanglement means that",
    "The capital cities of Europe include",
    "A haiku about autumn leaves:",
    "SELECT name, count(*) FROM orders",
    "The most important idea in economics is",
    "Once upon a time, a robot",
    "The French Revolution began in 1789 when",
    "Here is a recipe for a vegetable curry:",
    "The theory of evolution explains",
    "Dear hiring manager, I am writing to",
)


def prompts(tokenizer: Tokenizer, count: int, length: int, vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    out = []
    for i in range(count):
        ids = list(tokenizer.encode(OPENINGS[i % len(OPENINGS)]))
        out.append(ids + [rng.randrange(100, vocab) for _ in range(max(0, length - len(ids)))])
    return out


def run(
    model: str | None, kv_dtype: str, inputs: list[list[int]], tokens: int
) -> tuple[list[list[int]], int, float]:
    settings = EngineSettings(model=model, kv_dtype=kv_dtype)  # type: ignore[arg-type]
    loaded = load_engine(settings)
    engine = loaded.engine
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    outputs, steps = [], []
    for i, prompt in enumerate(inputs):
        engine.add_request(f"r{i}", prompt, params)
        produced: list[int] = []
        first = True
        while engine.has_unfinished_requests():
            started = time.perf_counter()
            for out in engine.step():
                produced.extend(out.new_token_ids)
            if not first:
                steps.append(time.perf_counter() - started)
            first = False
        outputs.append(produced)
    layout = engine.runner.cache.layout
    return outputs, layout.bytes_per_token, statistics.median(steps)


def agreeing(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="default: SmolLM2-135M")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    settings = EngineSettings(model=args.model)
    files = resolve_model(settings.model, settings.cache_dir)
    tokenizer = Tokenizer.from_dir(files.path)
    inputs = prompts(tokenizer, args.prompts, args.prompt_tokens, files.config.vocab_size)
    results = {d: run(args.model, d, inputs, args.tokens) for d in DTYPES}
    reference = results["float32"][0]
    table = Table(
        title=f"KV dtype: {args.prompts} prompts of {args.prompt_tokens} tokens, "
        f"{args.tokens} greedy tokens each"
    )
    for column in (
        "KV dtype",
        "bytes/token",
        "identical",
        "agreeing tokens (mean)",
        "first parting (min)",
        "decode step ms",
    ):
        table.add_column(column, justify="right")
    for dtype, (outputs, per_token, step_s) in results.items():
        agree = [agreeing(o, r) for o, r in zip(outputs, reference, strict=True)]
        same = sum(o == r for o, r in zip(outputs, reference, strict=True))
        parted = [a for a in agree if a < args.tokens]
        table.add_row(
            dtype,
            f"{per_token:,}",
            f"{same}/{len(outputs)}",
            f"{statistics.mean(agree):.1f}",
            str(min(parted)) if parted else "-",
            f"{step_s * 1e3:.1f}",
        )
    Console().print(table)


if __name__ == "__main__":
    main()
