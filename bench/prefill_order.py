"""A short prompt arriving behind a long one on one node: its time to first token when the
engine orders prompts by deadline (the default) and in arrival order, side by side in one run.

Loads the default model once. Each round sends a fresh ``--long``-token prompt, lets the
engine take one step of it, then sends a fresh ``--short``-token prompt, and steps until both
have their first token; the rounds alternate the engine's two orders
(``CRESCENT_PREFILL_ORDER``). Prints each order's median time to first token of the short and
the long prompt, from the moment each was sent, and the ratios.

    python bench/prefill_order.py [--long 5449] [--short 126] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

from shared.config import EngineSettings
from shared.engine.engine import LLMEngine
from shared.engine.factory import load_engine
from shared.sampling_params import SamplingParams

FIRST = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
ORDERS = ("arrival", "deadline")


def one_round(engine: LLMEngine, gen: torch.Generator, long: int, short: int, n: int) -> dict:
    """Seconds from sending to the first token, of the short and of the long prompt."""
    fresh = [torch.randint(100, 40000, (k,), generator=gen).tolist() for k in (long, short)]
    sent = {f"long{n}": time.perf_counter()}
    engine.add_request(f"long{n}", fresh[0], FIRST)
    ttft: dict[str, float] = {}

    def step() -> None:
        for out in engine.step():
            if out.output_token_ids and out.request_id not in ttft:
                ttft[out.request_id] = time.perf_counter() - sent[out.request_id]

    step()
    sent[f"short{n}"] = time.perf_counter()
    engine.add_request(f"short{n}", fresh[1], FIRST)
    while engine.has_unfinished_requests():
        step()
    return {"short": ttft[f"short{n}"], "long": ttft[f"long{n}"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--long", type=int, default=5449)
    parser.add_argument("--short", type=int, default=126)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    engine = load_engine(EngineSettings()).engine
    gen = torch.Generator().manual_seed(11)
    one_round(engine, gen, 256, 32, -1)  # warm-up
    results: dict[str, list[dict]] = {order: [] for order in ORDERS}
    for n in range(args.rounds):
        for order in ORDERS:
            engine.scheduler.by_deadline = order == "deadline"
            results[order].append(one_round(engine, gen, args.long, args.short, n))
    table = Table(title=f"{args.short}-token prompt sent one step into a {args.long}-token one")
    table.add_column("order")
    table.add_column("short: TTFT (s)", justify="right")
    table.add_column("long: TTFT (s)", justify="right")
    medians = {
        order: {k: statistics.median(r[k] for r in rounds) for k in ("short", "long")}
        for order, rounds in results.items()
    }
    for order in ORDERS:
        table.add_row(order, f"{medians[order]['short']:.2f}", f"{medians[order]['long']:.2f}")
    ratio = {k: medians["arrival"][k] / medians["deadline"][k] for k in ("short", "long")}
    table.add_row("arrival / deadline", f"{ratio['short']:.1f}x", f"{ratio['long']:.2f}x")
    Console().print(table)


if __name__ == "__main__":
    main()
