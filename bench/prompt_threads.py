"""Op-by-op steps beside a process that takes a core: the engine's thread governor against a
fixed thread team, side by side in one run.

Loads the default model once and computes short fresh prompts (one output token each, or with
``--decode N`` N tokens, whose decode steps run op by op where the fused decode call does not
load) in three conditions, interleaved round by round: the machine idle; a busy process (a Python
spin loop, outside Crescent's core ledger) on one core with the governor on; the same with
the governor off (every prompt step on all threads). Prints each condition's median and
95th-percentile prompt time, the ratios, and the share of each prompt's time the stepping
thread waited for a core (its run delay, the figure the governor's threshold is set
against): on the idle machine and with the fixed team beside the busy process.

    python bench/prompt_threads.py [--tokens 48] [--rounds 30] [--decode 0]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import torch
from rich.console import Console
from rich.table import Table

from shared.config import EngineSettings
from shared.engine.engine import LLMEngine
from shared.engine.factory import load_engine
from shared.engine.step_governor import StepGovernor
from shared.engine.threads import run_delay_s
from shared.sampling_params import SamplingParams

SPIN = "while True: pass"


class NeverContended(StepGovernor):
    """A governor that never sees contention: the fixed thread team."""

    def record(self, threads: int, wall_s: float, delayed_s: float) -> None:
        return None


class Prompts:
    def __init__(self, engine: LLMEngine, tokens: int, outputs: int = 1) -> None:
        self.engine, self.tokens, self.outputs = engine, tokens, outputs
        self.gen = torch.Generator().manual_seed(7)
        self.n = 0
        self.delays: list[float] = []

    def one(self) -> float:
        """Seconds to compute a fresh prompt and its output tokens."""
        self.n += 1
        prompt = torch.randint(100, 40000, (self.tokens,), generator=self.gen).tolist()
        params = SamplingParams(max_tokens=self.outputs, temperature=0.0, ignore_eos=True)
        self.engine.add_request(f"t{self.n}", prompt, params)
        started, delay = time.perf_counter(), run_delay_s()
        while self.engine.has_unfinished_requests():
            self.engine.step()
        wall = time.perf_counter() - started
        self.delays.append((run_delay_s() - delay) / wall)
        return wall


def measure(engine: LLMEngine, prompts: Prompts, spin: bool, governor: StepGovernor) -> float:
    engine.threads.governor = governor  # each condition keeps its own, as a long contention would
    if not spin:
        return prompts.one()
    busy = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        time.sleep(0.2)  # the spinner is running
        return prompts.one()
    finally:
        busy.kill()
        busy.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--decode", type=int, default=0, help="tokens decoded after each prompt")
    args = parser.parse_args()
    engine = load_engine(EngineSettings(kv_cache_mb=512)).engine
    prompts = Prompts(engine, args.tokens, max(1, args.decode))
    for _ in range(3):
        prompts.one()  # warm-up
    prompts.delays.clear()
    conditions = {
        "idle machine": (False, StepGovernor()),
        "a core taken, governor on": (True, StepGovernor()),
        "a core taken, fixed threads": (True, NeverContended()),
    }
    times: dict[str, list[float]] = {name: [] for name in conditions}
    delays: dict[str, list[float]] = {name: [] for name in conditions}
    for _ in range(args.rounds):
        for name, (spin, governor) in conditions.items():
            times[name].append(measure(engine, prompts, spin, governor))
            delays[name].append(prompts.delays[-1])
    what = f"{args.tokens}-token prompts" + (f" and {args.decode} tokens" if args.decode else "")
    fused = "fused decode" if engine.runner.fused is not None else "decode op by op"
    table = Table(title=f"{what}, {engine.threads.max_threads} threads, {fused}")
    for column in ("condition", "median ms", "p95 ms", "median / idle", "run delay share"):
        table.add_column(column, justify="right")
    base = statistics.median(times["idle machine"])
    for name, values in times.items():
        median = statistics.median(values)
        p95 = statistics.quantiles(values, n=20)[-1]
        delay = statistics.median(delays[name])
        row = (f"{median * 1e3:.0f}", f"{p95 * 1e3:.0f}", f"{median / base:.2f}", f"{delay:.2f}")
        table.add_row(name, *row)
    Console().print(table)


if __name__ == "__main__":
    main()
