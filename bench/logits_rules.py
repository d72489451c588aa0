"""What per-sequence logits rules cost a real decode step: the same batch of B sequences of the
default model decoding 64 tokens, with no rule, with a JSON-schema grammar (llguidance), and
with the frequency, presence and repetition penalties. Side by side, turn by turn.

Every sequence generates exactly ``--steps`` tokens (``ignore_eos``; the grammar is an array of
at least 20 orders, so no sequence completes its JSON early). The figure is the median decode
step (one token for each of the B sequences) over every run of a configuration.

    .venv/bin/python bench/logits_rules.py [--runs 3] [--steps 64]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench.grammar_schemas import ORDER
from shared.config import EngineSettings
from shared.engine.engine import LLMEngine
from shared.engine.factory import load_engine
from shared.model.grammar import json_schema_grammar
from shared.sampling_params import SamplingParams

BATCHES = (1, 8)
PROMPT = "Write the orders of today as JSON."


def configurations(steps: int) -> dict[str, SamplingParams]:
    base = SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True)
    orders = json_schema_grammar({"type": "array", "items": ORDER, "minItems": 20})
    return {
        "no rule": base,
        "JSON-schema grammar": SamplingParams(
            max_tokens=steps, temperature=0.0, ignore_eos=True, grammar=orders
        ),
        "three penalties": SamplingParams(
            max_tokens=steps,
            temperature=0.0,
            ignore_eos=True,
            frequency_penalty=0.5,
            presence_penalty=0.5,
            repetition_penalty=1.2,
        ),
    }


def decode_steps(
    engine: LLMEngine, prompt: list[int], batch: int, params: SamplingParams
) -> list[float]:
    """Seconds of each decode step of one batch run to the end."""
    engine.step_timings.clear()
    engine.generate([prompt] * batch, params)
    return [t.seconds for t in engine.step_timings if t.num_tokens == t.num_seqs == batch]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=64)
    args = parser.parse_args()
    loaded = load_engine(EngineSettings(enable_prefix_caching=False))
    engine, tokenizer = loaded.engine, loaded.tokenizer
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}])
    configs = configurations(args.steps)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, prompt {len(prompt)} "
        f"tokens, {args.steps} decode steps, {args.runs} runs"
    )
    print("| batch | rules | median decode step | vs no rule |")
    print("|---|---|---|---|")
    for batch in BATCHES:
        decode_steps(engine, prompt, batch, configs["no rule"])  # warm-up
        times: dict[str, list[float]] = {name: [] for name in configs}
        for _ in range(args.runs):
            for name, params in configs.items():
                times[name] += decode_steps(engine, prompt, batch, params)
        base = statistics.median(times["no rule"])
        for name, values in times.items():
            median = statistics.median(values)
            print(
                f"| {batch} | {name} | {median * 1000:.2f} ms | "
                f"{(median - base) * 1000:+.2f} ms ({median / base - 1:+.1%}) |"
            )


if __name__ == "__main__":
    main()
