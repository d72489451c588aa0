"""The command line of ``crescent bench`` and the settings it becomes.

Only argparse and the standard library here: ``crescent`` builds every sub-command's parser
at start-up, and the heavy imports (httpx, numpy, matplotlib) wait until a bench runs.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path

from crescent.cli_settings import BenchKeySettings, named_variable
from crescent.traces import CONVERSATION_TRACE

DATASETS = ("trace", "multiturn", "shared-prefix", "random")
DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
_TARGET_KEYS = ("model", "key_env", "cache")


@dataclass(frozen=True, slots=True)
class Target:
    """One server to measure: where it listens, which model to ask for (None: the first the
    server lists) and its API key. ``cache_off`` sends every request with a ``cache_salt`` of
    its own, so a server that honours the field (Crescent, vLLM) reuses no cached prefix."""

    name: str
    base_url: str
    model: str | None
    api_key: str | None
    cache_off: bool = False

    def describe(self) -> dict[str, object]:
        """The target as the result file records it: never the key, only whether one is set."""
        return {
            "name": self.name,
            "base_url": self.base_url,
            "model": self.model,
            "api_key_set": self.api_key is not None,
            "cache_off": self.cache_off,
        }


def api_base(url: str) -> str:
    """``http://host:port`` or ``http://host:port/v1`` (any trailing slash) as the latter."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


def parse_target(spec: str, default_key: str | None) -> Target:
    """``NAME=URL[,model=M][,key_env=VAR][,cache=off]``. The key comes from the environment
    variable ``VAR`` (a key on the command line would show in ``ps``), else ``default_key``."""
    name, sep, rest = spec.partition("=")
    if not sep or not name or not rest:
        raise ValueError(f"target {spec!r} is not NAME=URL[,key=value...]")
    url, *pairs = rest.split(",")
    fields: dict[str, str] = {}
    for pair in pairs:
        field_name, sep, value = pair.partition("=")
        if not sep or field_name not in _TARGET_KEYS:
            raise ValueError(f"target {name}: {pair!r} is not one of {', '.join(_TARGET_KEYS)}=…")
        fields[field_name] = value
    if fields.get("cache", "on") not in ("on", "off"):
        raise ValueError(f"target {name}: cache must be on or off")
    api_key = default_key
    if "key_env" in fields:
        api_key = named_variable(fields["key_env"])
        if api_key is None:
            raise ValueError(f"target {name}: environment variable {fields['key_env']} is unset")
    return Target(name, api_base(url), fields.get("model"), api_key, fields.get("cache") == "off")


@dataclass(frozen=True, slots=True)
class WorkloadOptions:
    """What to send: the dataset and its shape; lengths in tokens the server sees."""

    dataset: str
    trace: Path
    block_tokens: int
    num_requests: int
    seed: int
    input_len: int
    output_len: int
    prefix_len: int
    num_prefixes: int
    max_tokens_cap: int | None


@dataclass(frozen=True, slots=True)
class PacingOptions:
    """When to send: Poisson at ``request_rate`` per second (inf: all at once), or the trace's
    own times multiplied by ``time_scale``; at most ``concurrency`` in flight (0: no cap)."""

    request_rate: float
    timestamps: bool
    time_scale: float
    concurrency: int


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """Everything one ``crescent bench`` command asked for."""

    targets: tuple[Target, ...]
    compare: bool
    rounds: int
    workload: WorkloadOptions
    pacing: PacingOptions
    slo_ttft_ms: float
    slo_tpot_ms: float
    out: Path
    ignore_eos: bool
    timeout_s: float
    warmup: int
    plots: bool
    #: A sweep of Poisson rates, one run each (empty: one run at ``pacing``).
    request_rates: tuple[float, ...] = ()
    #: The objective scales a sweep reports attainment at.
    slo_scales: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
    #: Each request carries the objectives (``ttft_slo_ms``, ``tbt_slo_ms``), as a client
    #: of a server that honours them would send them.
    send_slos: bool = False


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default=DEFAULT_BASE_URL, help="the server's API (…/v1)")
    p.add_argument("--model", help="the model (None: the first the server lists)")
    p.add_argument("--api-key", help="bearer key (None: $OPENAI_API_KEY)")
    w = p.add_argument_group("workload")
    w.add_argument("--dataset", choices=DATASETS, default="multiturn", help="what to send")
    w.add_argument("--trace", type=Path, default=CONVERSATION_TRACE, help="Mooncake-format")
    w.add_argument("--block-tokens", type=int, default=32, help="tokens per 512-token block")
    w.add_argument("--num-requests", type=int, default=100, help="per target")
    w.add_argument("--seed", type=int, default=0, help="token ids and arrival times")
    w.add_argument("--input-len", type=int, default=256, help="synthetic: prompt tokens")
    w.add_argument("--output-len", type=int, default=32, help="synthetic: completion tokens")
    w.add_argument("--prefix-len", type=int, default=1024, help="shared-prefix: shared tokens")
    w.add_argument("--num-prefixes", type=int, default=8, help="shared-prefix: groups")
    w.add_argument("--max-tokens-cap", type=int, help="max_tokens at most this")
    w.add_argument("--ignore-eos", action="store_true", help="send ignore_eos: true")
    pace = p.add_argument_group("pacing")
    when = pace.add_mutually_exclusive_group()
    when.add_argument("--request-rate", type=float, default=math.inf, help="Poisson, req/s")
    when.add_argument("--timestamps", action="store_true", help="the trace's own times")
    when.add_argument(
        "--request-rates",
        type=_numbers,
        metavar="R1,R2,...",
        help="a sweep: one run per Poisson rate (req/s), goodput and SLO scales at each",
    )
    pace.add_argument("--time-scale", type=float, default=1.0, help="multiplies trace times")
    pace.add_argument("--concurrency", type=int, default=0, help="in flight at most; 0: any")
    pace.add_argument("--timeout-s", type=float, default=600.0, help="per request")
    pace.add_argument("--warmup", type=int, default=1, help="unmeasured requests first")
    r = p.add_argument_group("results")
    r.add_argument("--slo-ttft-ms", type=float, default=2000.0, help="goodput's TTFT bound")
    r.add_argument("--slo-tpot-ms", type=float, default=200.0, help="goodput's TPOT bound")
    r.add_argument(
        "--slo-scales",
        type=_numbers,
        default=(0.25, 0.5, 1.0, 2.0, 4.0, 8.0),
        metavar="S1,S2,...",
        help="a sweep's objective scales (both SLOs multiplied) to report attainment at",
    )
    r.add_argument(
        "--send-slos",
        action="store_true",
        help="each request carries the objectives as ttft_slo_ms and tbt_slo_ms (extension "
        "fields; Crescent orders prompts by them and refuses what cannot meet them)",
    )
    r.add_argument("--out", type=Path, help="results (None: crescent-bench-<time>/)")
    r.add_argument("--no-plots", action="store_true", help="write no PNGs")
    c = p.add_argument_group("comparison")
    c.add_argument(
        "--compare", action="store_true", help="two or more --target in alternating rounds"
    )
    c.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="NAME=URL[,model=M][,key_env=VAR][,cache=off]",
        help="a server to compare (two or more; ratios are against the first)",
    )
    c.add_argument("--rounds", type=int, default=4, help="rounds per target with --compare")


def options_from(args: argparse.Namespace) -> BenchOptions:
    """The settings of parsed arguments; ValueError says which one is wrong."""
    default_key = args.api_key or BenchKeySettings().key()
    _check_numbers(args)
    if args.target:
        targets = tuple(parse_target(s, default_key) for s in args.target)
        if len({t.name for t in targets}) != len(targets):
            raise ValueError("target names must differ")
    else:
        targets = (Target("default", api_base(args.base_url), args.model, default_key),)
    if args.compare and len(targets) < 2:
        raise ValueError("--compare needs two or more --target")
    if not args.compare and len(targets) != 1:
        raise ValueError("more than one --target needs --compare")
    if args.timestamps and args.dataset not in ("trace", "multiturn"):
        raise ValueError("--timestamps needs a trace dataset (trace or multiturn)")
    workload = WorkloadOptions(
        args.dataset,
        args.trace,
        args.block_tokens,
        args.num_requests,
        args.seed,
        args.input_len,
        args.output_len,
        args.prefix_len,
        args.num_prefixes,
        args.max_tokens_cap,
    )
    pacing = PacingOptions(args.request_rate, args.timestamps, args.time_scale, args.concurrency)
    out = args.out or Path(time.strftime("crescent-bench-%Y%m%d-%H%M%S"))
    return BenchOptions(
        targets,
        args.compare,
        args.rounds if args.compare else 1,
        workload,
        pacing,
        args.slo_ttft_ms,
        args.slo_tpot_ms,
        out,
        args.ignore_eos,
        args.timeout_s,
        args.warmup,
        not args.no_plots,
        tuple(args.request_rates or ()),
        tuple(args.slo_scales),
        args.send_slos,
    )


def _numbers(text: str) -> tuple[float, ...]:
    """``1,2.5,4`` as numbers, each finite and above 0."""
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of numbers") from None
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: each must be a number above 0")
    return values


def _check_numbers(args: argparse.Namespace) -> None:
    positive = ("block_tokens", "num_requests", "input_len", "output_len", "num_prefixes")
    for name in positive:
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    at_least_zero = ("prefix_len", "concurrency", "warmup")
    for name in at_least_zero:
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must not be negative")
    if not args.request_rate > 0 or not args.time_scale > 0:
        raise ValueError("--request-rate and --time-scale must be above 0")
    if args.max_tokens_cap is not None and args.max_tokens_cap < 1:
        raise ValueError("--max-tokens-cap must be at least 1")
    if args.rounds < 1 or args.timeout_s <= 0:
        raise ValueError("--rounds must be at least 1 and --timeout-s above 0")
