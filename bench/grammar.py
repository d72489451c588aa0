"""xgrammar against llguidance, side by side on the default model's vocabulary: which JSON
schema features each one enforces, what compiling a schema costs, and what the grammar adds to
each decode step at batch 1 and batch 8.

A step, for every sequence of the batch: compute the bitmask of allowed next tokens, apply it to
a row of logits (49,152 float32 values), and advance the matcher by the token. The tokens are
those of a valid instance of the schema (an order with three items: 60-odd tokens), so every
step is one a real constrained decode takes. "serial" computes the batch's masks one after the
other on this thread; "parallel" uses the library's own batch call (its thread pool).

    .venv/bin/python bench/grammar.py [--reps 30]

xgrammar is not a dependency of Crescent: ``pip install --no-deps xgrammar apache-tvm-ffi``
before running this (its declared dependencies pull in triton and transformers, which only
its GPU kernels and its Hugging Face helpers need).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench.grammar_schemas import FEATURES, ORDER, ORDER_INSTANCE
from shared.model.files import default_cache_dir, resolve_model
from shared.model.logits_processing import apply_bitmask as apply_row
from shared.model.tokenizer import Tokenizer

VOCAB = 49152
EOS = 2


def apply_bitmask(logits: torch.Tensor, mask: torch.Tensor) -> None:
    """Crescent's way: row by row, in numpy."""
    for row, words in zip(logits.numpy(), mask.numpy(), strict=True):
        apply_row(row, words)


class Library:
    """One grammar library behind four calls, so both are timed by the same loop."""

    name: str

    def compile(self, schema: dict[str, Any]) -> Any: ...
    def matcher(self, compiled: Any) -> Any: ...
    def fill(self, matchers: list[Any], mask: torch.Tensor, parallel: bool) -> None: ...
    def accept(self, matcher: Any, token: int) -> bool: ...
    def can_end(self, matcher: Any) -> bool: ...
    def apply(self, logits: torch.Tensor, mask: torch.Tensor) -> None:
        apply_bitmask(logits, mask)


class LLGuidance(Library):
    name = "llguidance"

    def __init__(self, tokenizer: Tokenizer) -> None:
        import llguidance

        self.lib = llguidance
        self.tok = llguidance.LLTokenizer(tokenizer.backend_json(), n_vocab=VOCAB, eos_token=EOS)
        self.executor = llguidance.LLExecutor()

    def compile(self, schema: dict[str, Any]) -> Any:
        grammar = self.lib.LLMatcher.grammar_from_json_schema(schema)
        error, messages = self.lib.LLMatcher.validate_grammar_with_warnings(grammar, self.tok)
        if error:
            raise ValueError(messages[0])
        return grammar

    def matcher(self, compiled: Any) -> Any:
        return self.lib.LLMatcher(self.tok, compiled, log_level=0)

    def fill(self, matchers: list[Any], mask: torch.Tensor, parallel: bool) -> None:
        if parallel:
            pairs = [(m, i) for i, m in enumerate(matchers)]
            words = mask.shape[1]
            self.executor.unsafe_compute_mask_ptr(pairs, mask.data_ptr(), words * 4, len(pairs))
            return
        for i, m in enumerate(matchers):
            row = mask[i]
            m.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)

    def accept(self, matcher: Any, token: int) -> bool:
        return bool(matcher.consume_token(token))

    def can_end(self, matcher: Any) -> bool:
        return bool(matcher.is_accepting())


class XGrammar(Library):
    name = "xgrammar"

    def __init__(self, tokenizer: Tokenizer) -> None:
        import xgrammar

        self.lib = xgrammar
        vocab = tokenizer.vocab_by_id()
        info = xgrammar.TokenizerInfo(
            vocab, xgrammar.VocabType.BYTE_LEVEL, vocab_size=VOCAB, stop_token_ids=[EOS]
        )
        self.compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
        self.batch = xgrammar.BatchGrammarMatcher()

    def compile(self, schema: dict[str, Any]) -> Any:
        return self.compiler.compile_json_schema(json.dumps(schema))

    def matcher(self, compiled: Any) -> Any:
        return self.lib.GrammarMatcher(compiled)

    def fill(self, matchers: list[Any], mask: torch.Tensor, parallel: bool) -> None:
        if parallel:
            self.batch.batch_fill_next_token_bitmask(matchers, mask)
            return
        for i, m in enumerate(matchers):
            m.fill_next_token_bitmask(mask, i)

    def accept(self, matcher: Any, token: int) -> bool:
        return bool(matcher.accept_token(token))

    def can_end(self, matcher: Any) -> bool:
        return bool(matcher.accept_token(EOS))

    def apply_native(self, logits: torch.Tensor, mask: torch.Tensor) -> None:
        self.lib.apply_token_bitmask_inplace(logits, mask, backend="cpu")


def takes(lib: Library, tokenizer: Tokenizer, matcher: Any, value: Any) -> bool:
    """Whether ``matcher`` accepts every token of ``value`` as JSON and may end after them."""
    for token in tokenizer.encode(json.dumps(value), add_special_tokens=False):
        if not lib.accept(matcher, token):
            return False
    return lib.can_end(matcher)


def covers(lib: Library, tokenizer: Tokenizer, feature: tuple[Any, Any, Any]) -> str:
    """ "yes", or why not: the compile error, the valid instance refused, or the breaking
    one accepted (the feature is ignored)."""
    schema, instance, breaking = feature
    try:
        compiled = lib.compile(schema)
        lib.matcher(compiled)
    except Exception as exc:
        return f"no: {str(exc).splitlines()[0][:70]}"
    if not takes(lib, tokenizer, lib.matcher(compiled), instance):
        return "no: refuses a valid instance"
    if takes(lib, tokenizer, lib.matcher(compiled), breaking):
        return "no: ignored (accepts a breaking value)"
    return "yes"


def compile_ms(lib: Library, schema: dict[str, Any], reps: int) -> float:
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        lib.matcher(lib.compile(schema))
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def step_us(
    lib: Library,
    compiled: Any,
    tokens: list[int],
    batch: int,
    parallel: bool,
    reps: int,
    apply: Callable[[torch.Tensor, torch.Tensor], None],
) -> tuple[float, float, float]:
    """Median microseconds per step: mask, apply, accept (each over the whole batch)."""
    mask = torch.full((batch, (VOCAB + 31) // 32), -1, dtype=torch.int32)
    logits = torch.randn(batch, VOCAB)
    fills, applies, accepts = [], [], []
    for _ in range(reps):
        matchers = [lib.matcher(compiled) for _ in range(batch)]
        for token in tokens:
            t0 = time.perf_counter()
            lib.fill(matchers, mask, parallel)
            t1 = time.perf_counter()
            apply(logits, mask)
            t2 = time.perf_counter()
            for m in matchers:
                lib.accept(m, token)
            t3 = time.perf_counter()
            fills.append(t1 - t0)
            applies.append(t2 - t1)
            accepts.append(t3 - t2)
    return tuple(statistics.median(x) * 1e6 for x in (fills, applies, accepts))  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = Tokenizer.from_dir(resolve_model(None, default_cache_dir()).path)
    libs: list[Library] = [XGrammar(tokenizer), LLGuidance(tokenizer)]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread; vocabulary {VOCAB}")

    print("\n## Coverage (compiles, accepts a valid instance, refuses a breaking one)")
    totals = dict.fromkeys((lib.name for lib in libs), 0)
    for feature, cases in FEATURES.items():
        verdicts = [covers(lib, tokenizer, cases) for lib in libs]
        for lib, verdict in zip(libs, verdicts, strict=True):
            totals[lib.name] += verdict == "yes"
        print(f"| {feature} | " + " | ".join(verdicts) + " |")
    print("covered: " + ", ".join(f"{n} {c}/{len(FEATURES)}" for n, c in totals.items()))

    tokens = tokenizer.encode(json.dumps(ORDER_INSTANCE), add_special_tokens=False)
    print(f"\n## Compile (the order schema, cache off), median of {args.reps}")
    for lib in libs:
        print(f"{lib.name:<11} {compile_ms(lib, ORDER, args.reps):8.3f} ms")

    print(f"\n## Per decode step, {len(tokens)} steps x {args.reps} reps, median µs")
    print("| library | batch | masks | mask | apply | accept | total |")
    for lib in libs:
        compiled = lib.compile(ORDER)
        for batch, parallel in ((1, False), (8, False), (8, True)):
            fill, app, acc = step_us(lib, compiled, tokens, batch, parallel, args.reps, lib.apply)
            how = "parallel" if parallel else "serial"
            print(f"| {lib.name} | {batch} | {how} | {fill:.1f} | {app:.1f} | {acc:.1f} | "
                  f"{fill + app + acc:.1f} |")  # fmt: skip
    xgr = libs[0]
    assert isinstance(xgr, XGrammar)
    for batch in (1, 8):
        mask = torch.full((batch, (VOCAB + 31) // 32), -1, dtype=torch.int32)
        logits = torch.randn(batch, VOCAB)
        ways = (("torch unpack (ours)", apply_bitmask), ("xgrammar cpu", xgr.apply_native))
        for name, fn in ways:
            times = []
            for _ in range(200):
                t0 = time.perf_counter()
                fn(logits, mask)
                times.append(time.perf_counter() - t0)
            print(f"apply at batch {batch}, {name}: {statistics.median(times) * 1e6:.1f} µs")


if __name__ == "__main__":
    main()
