"""Time to first token of a cached prefix served from each tier, against recomputing it.

Two `crescent up --with-s3` stacks, one after the other in one run:
- **nvme**: NVMe large enough to keep everything. A prompt of 1K and one of 2K tokens are
  asked cold (recomputed) and again at once (the pool); then other prompts push them out of
  every pool, and they are asked a third time: from NVMe.
- **s3**: NVMe's watermarks at zero, so tierd moves every block on to S3 as soon as it has it;
  the same prompts, pushed out of the pools, come back from S3.

Beside each tier's time: the read bandwidth the node and tierd measured for it, and the raw
speed of the same bytes read with nothing in between (the files with plain reads, the objects
with concurrent GETs) — the limit a tier's reads can approach. Every answer is greedy, and each
cached one is checked against the recomputed one's text.

    .venv/bin/python bench/tiers.py [--lengths 1024 2048] [--reps 2]

For a model whose compute is dear (an 8B GGUF file from ``bench/models.py``), pushing prompts
out of the pools with new prompts costs more compute than the measurement itself, so
``--evict restart`` empties the pools by killing both nodes (``crescent up`` starts them
again) instead:

    .venv/bin/python bench/tiers.py --model FILE.gguf --lengths 4096 --reps 1 \
        --evict restart --kv-cache-mb 2048
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from openai import OpenAI
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.chaos import Beats
from bench.faults import Stack, collect_logs
from bench.tier_probe import TierProbe, chain_of
from crescent.s3_server import BUCKET
from shared.model.files import resolve_model
from shared.model.tokenizer import Tokenizer

API_KEY = "bench-tiers"
BLOCK_TOKENS = 32
WORDS = [
    "alpha",
    "brisk",
    "cedar",
    "dune",
    "ember",
    "fjord",
    "grove",
    "heron",
    "inlet",
    "juniper",
    "kelp",
    "lark",
]


def text_of(label: str, tokens: int, tok: Tokenizer) -> str:
    """A prompt of ``tokens`` tokens (or one or two fewer) that starts with ``label``."""
    rng = random.Random(label)
    words = [f"[{label}]"]
    while True:
        words.append(rng.choice(WORDS))
        if len(tok.encode(" ".join(words))) >= tokens:
            return " ".join(words[:-1])


@dataclass
class Result:
    ttft: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    cached: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    same_text: dict[tuple[str, int], list[bool]] = field(default_factory=dict)
    bandwidth: dict[str, float] = field(default_factory=dict)
    raw: dict[str, float] = field(default_factory=dict)

    def add(self, source: str, length: int, answer: Answer, cold: Answer | None = None) -> None:
        key = (source, length)
        self.ttft.setdefault(key, []).append(answer.ttft)
        self.cached.setdefault(key, []).append(answer.tier_tokens(source))
        same = cold is None or answer.text == cold.text
        self.same_text.setdefault(key, []).append(same)


@dataclass(slots=True)
class Answer:
    """One streamed completion: seconds to its first token, its text, what it found cached."""

    ttft: float
    text: str
    cached: int
    by_tier: dict[str, int]

    def tier_tokens(self, source: str) -> int:
        if source == "recompute":
            return 0
        return self.cached if source == "pool" else self.by_tier.get(source, 0)


class Client:
    def __init__(self, stack: Stack, max_tokens: int) -> None:
        self.api = OpenAI(base_url=stack.base_url, api_key=API_KEY, max_retries=0, timeout=1800)
        self.model = self.api.models.list().data[0].id
        self.max_tokens = max_tokens

    def ask(self, prompt: str) -> Answer:
        """A greedy completion, streamed, timed to its first token."""
        started = time.perf_counter()
        first, usage, parts = 0.0, None, []
        stream = self.api.completions.create(
            model=self.model,
            prompt=prompt,
            max_tokens=self.max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                first = first or time.perf_counter() - started
                parts.append(chunk.choices[0].text)
            usage = chunk.usage or usage
        assert usage is not None and usage.prompt_tokens_details is not None
        details = usage.prompt_tokens_details
        by_tier = (details.model_extra or {}).get("cached_tokens_by_tier", {})
        return Answer(first, "".join(parts), details.cached_tokens or 0, by_tier)


def stack_env(
    cache_dir: Path, options: argparse.Namespace, extra: dict[str, str]
) -> dict[str, str]:
    # Another model than SmolLM2: its nodes time themselves at start, so the scheduler does
    # not price them by SmolLM2's prior (CRESCENT_STARTUP_PROBE_TOKENS).
    model = (
        {"CRESCENT_MODEL": str(options.model), "CRESCENT_STARTUP_PROBE_TOKENS": "64"}
        if options.model
        else {}
    )
    return (
        model
        | {
            "CRESCENT_CACHE_DIR": str(cache_dir),
            "CRESCENT_KV_CACHE_MB": str(options.kv_cache_mb),
            # Timed here, not bounded: a large model's cold prompt may compute for many minutes.
            "CRESCENT_FIRST_TOKEN_TIMEOUT_S": "3600",
            "CRESCENT_REQUEST_TIMEOUT_S": "3600",
            "CRESCENT_API_KEYS": f"{API_KEY}:bench",
            "CRESCENT_HEARTBEAT_INTERVAL_S": "0.5",
            "UCX_NET_DEVICES": "lo",
            "UCX_WARN_UNUSED_ENV_VARS": "n",
        }
        | extra
    )


def wait_below(
    probe: TierProbe, label: str, tier: str, blocks: int, tok: Tokenizer, in_pools: bool = False
) -> None:
    """Until the prompt's first ``blocks`` blocks are in ``tier`` and in no pool (or, with
    ``in_pools``, whatever the pools hold)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        held = probe.nvme_headers() if tier == "nvme" else probe.s3_headers()
        chain = chain_of(f"[{label}]", held, tok)[:blocks]
        pooled = {h for h, _, t in probe.rows() if t == "dram"}
        if len(chain) == blocks and (in_pools or not pooled & set(chain)):
            return
        time.sleep(1)
    raise SystemExit(f"{label} never reached {tier} alone\n{collect_logs(probe.data_dir)}")


def flood(client: Client, rep: int, tier: str, lengths: list[int], tok: Tokenizer) -> None:
    """Pushes earlier prompts out of every pool: new prompts filling them twice over."""
    for i in range(4):
        client.ask(text_of(f"flood-{tier}-{rep}-{i}", max(lengths), tok))


def restart_nodes(stack: Stack, client: Client, tok: Tokenizer, label: str) -> None:
    """Empties both pools: the nodes killed, started again by `crescent up`, and warmed with a
    short prompt of their own so a restart's first-request costs stay out of the figure."""
    for name in ("prefill-0", "decode-0"):
        stack.wait_replaced(name, stack.kill(name))
    deadline = time.monotonic() + 300
    while True:
        try:
            client.ask(text_of(label, 64, tok))
            return
        except Exception:  # the nodes are still starting: asked again
            if time.monotonic() > deadline:
                raise
            time.sleep(2)


def run_stack(tier: str, options: argparse.Namespace, cache_dir: Path, result: Result) -> None:
    lengths: list[int] = options.lengths
    extra = {"CRESCENT_NVME_CAPACITY_MB": str(options.nvme_mb)}
    if tier == "s3":
        # Watermarks below one block: every block moves on to S3 as soon as tierd has it.
        extra |= {"CRESCENT_NVME_HIGH_WATERMARK": "1e-5", "CRESCENT_NVME_LOW_WATERMARK": "1e-5"}
    data_dir = Path(tempfile.mkdtemp(prefix=f"crescent-bench-tiers-{tier}-"))
    stack = Stack.start(data_dir, stack_env(cache_dir, options, extra), ["--with-s3"], 1800)
    tok = Tokenizer.from_dir(resolve_model(options.model, cache_dir).path)
    probe = TierProbe(data_dir)
    try:
        client = Client(stack, options.max_tokens)
        client.ask(text_of(f"warm-{tier}", 64, tok))
        for rep in range(options.reps):
            prompts = {
                n: (f"{tier}-{rep}-{n}", text_of(f"{tier}-{rep}-{n}", n, tok)) for n in lengths
            }
            cold: dict[int, Answer] = {}
            for n, (_, text) in prompts.items():
                cold[n] = client.ask(text)
                result.add("recompute", n, cold[n])
                result.add("pool", n, client.ask(text), cold[n])
                print(f"recompute {n}: ttft {cold[n].ttft:.3f} s", flush=True)
            if options.evict == "restart":
                for n, (label, _) in prompts.items():
                    wait_below(probe, label, tier, n // BLOCK_TOKENS - 1, tok, in_pools=True)
                restart_nodes(stack, client, tok, f"rewarm-{tier}-{rep}")
            else:
                flood(client, rep, tier, lengths, tok)
            for n, (label, text) in prompts.items():
                wait_below(probe, label, tier, n // BLOCK_TOKENS - 1, tok)
                answer = client.ask(text)
                result.add(tier, n, answer, cold[n])
                print(f"{tier} {n}: ttft {answer.ttft:.3f} s, {answer.by_tier}", flush=True)
        asyncio.run(measured(stack, tier, result))
        result.raw[tier] = raw_speed(probe, tier)
    except BaseException:
        print(collect_logs(data_dir), file=sys.stderr)
        raise
    finally:
        stack.stop()
        if not options.keep:
            shutil.rmtree(data_dir, ignore_errors=True)


async def measured(stack: Stack, tier: str, result: Result) -> None:
    """The bandwidths the stack measured for ``tier``: tierd's reads, the prefill node's
    fetches (through tierd, or straight from the files: the faster is reported)."""
    beats = Beats()
    await beats.start(stack)
    await asyncio.sleep(2.0)  # a few heartbeats of every service
    await beats.close()
    for _, status in beats.latest.values():
        if status.role == "tierd" and tier in status.read_bandwidth:
            result.bandwidth[f"tierd reads {tier}"] = status.read_bandwidth[tier]
        if status.role == "prefill":
            for key, rate in status.fetch_bandwidth.items():
                if key.endswith(f"-{tier}"):
                    result.bandwidth[f"prefill node fetches {tier}"] = rate


def raw_speed(probe: TierProbe, tier: str) -> float:
    """Bytes/s of reading every stored block of ``tier`` with nothing in between."""
    started, num_bytes = time.perf_counter(), 0
    if tier == "nvme":
        for path in probe.nvme_dir.glob("*/*.blk"):
            with open(path, "rb", buffering=0) as f:
                num_bytes += len(f.read())
    else:
        s3 = probe.s3()
        keys = probe.s3_keys()
        started = time.perf_counter()

        def get(key: str) -> int:
            return len(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            num_bytes = sum(pool.map(get, keys))
    return num_bytes / (time.perf_counter() - started)


def report(result: Result, lengths: list[int]) -> None:
    table = Table(title="Time to first token of a cached prefix, by where it is served from")
    for col in ("prompt", "source", "median TTFT s", "cached tokens", "vs recompute", "text"):
        table.add_column(col, justify="right")
    for n in lengths:
        base = sorted(result.ttft[("recompute", n)])[len(result.ttft[("recompute", n)]) // 2]
        for source in ("recompute", "pool", "nvme", "s3"):
            values = sorted(result.ttft.get((source, n), []))
            if not values:
                continue
            median = values[len(values) // 2]
            cached = min(result.cached[(source, n)])
            same = "cold's" if all(result.same_text[(source, n)]) else "DIFFERS"
            table.add_row(
                str(n), source, f"{median:.3f}", str(cached), f"{base / median:.1f}x sooner", same
            )
    Console().print(table)
    bw = Table(title="Read bandwidth (MB/s): measured by the stack, and the raw speed")
    for col in ("what", "MB/s"):
        bw.add_column(col, justify="right")
    for what, rate in sorted(result.bandwidth.items()):
        bw.add_row(what, f"{rate / 1e6:.0f}")
    for tier, rate in result.raw.items():
        bw.add_row(f"raw {tier} (plain reads of the stored blocks)", f"{rate / 1e6:.0f}")
    Console().print(bw)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--tiers", nargs="+", default=["nvme", "s3"], choices=["nvme", "s3"])
    parser.add_argument("--model", default=None, help="a GGUF file or folder (default: SmolLM2)")
    parser.add_argument("--kv-cache-mb", type=int, default=160, help="each node's KV pool")
    parser.add_argument("--nvme-mb", type=int, default=4096, help="tierd's NVMe capacity")
    parser.add_argument("--keep", action="store_true", help="keep each stack's data folder")
    parser.add_argument("--max-tokens", type=int, default=8, help="greedy tokens per answer")
    parser.add_argument(
        "--evict",
        choices=["flood", "restart"],
        default="flood",
        help="empty the pools with new prompts, or by restarting both nodes",
    )
    args = parser.parse_args()
    cache_dir = Path(os.environ.get("CRESCENT_CACHE_DIR", Path.home() / ".cache" / "crescent"))
    result = Result()
    for tier in args.tiers:
        run_stack(tier, args, cache_dir, result)
    report(result, args.lengths)
    if not all(all(v) for v in result.same_text.values()):
        raise SystemExit("a cached answer's text differs from the recomputed one's")


if __name__ == "__main__":
    main()
