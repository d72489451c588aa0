"""`crescent bench` checked against NVIDIA's aiperf on the same workload and server.

Starts `crescent up`, then runs both clients at the same time against it, each sending half of
``--concurrency`` streams of the same synthetic workload (``--input-len`` fresh prompt tokens,
``--output-len`` completion tokens with ``ignore_eos``, streaming ``/v1/completions``), for
``--repeats`` rounds with new prompts each. Measured side by side, both see the same server
under the same load, aiperf's own CPU use included (its processes share the cores with the
server), so what differs is the measuring alone. Prints both tools' mean TTFT and inter-token
latency with their ratio. aiperf's "inter token latency" is per request
``(e2e - TTFT) / (output tokens - 1)``, which `crescent bench` calls TPOT; its ITL (every gap
between streamed chunks) is printed beside it.

aiperf is large (about 1.2 GB with its dependencies) and not one of Crescent's dependencies:
install it in a venv of its own and pass its executable:

    python3 -m venv /tmp/aiperf-venv && /tmp/aiperf-venv/bin/pip install aiperf
    .venv/bin/python bench/aiperf_check.py --aiperf /tmp/aiperf-venv/bin/aiperf
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from subprocess import DEVNULL, Popen
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.faults import Stack, collect_logs


def model_dir() -> Path:
    from shared.model.files import resolve_model

    cache = Path(os.environ.get("CRESCENT_CACHE_DIR", Path.home() / ".cache" / "crescent"))
    return resolve_model(None, cache).path


def crescent_bench(args: argparse.Namespace, base_url: str, out: Path, seed: int) -> Popen[bytes]:
    argv = [sys.executable, "-m", "crescent", "bench", "--base-url", base_url, "--no-plots"]
    argv += ["--dataset", "random", "--input-len", str(args.input_len), "--seed", str(seed)]
    argv += ["--output-len", str(args.output_len), "--ignore-eos", "--warmup", "1"]
    argv += ["--concurrency", str(args.concurrency // 2), "--num-requests", str(args.requests)]
    argv += ["--out", str(out)]
    return Popen(argv, stdout=DEVNULL)


def crescent_bench_figures(out: Path) -> dict[str, float]:
    summary = json.loads((out / "result.json").read_text())["summary"]
    return {
        "ttft_ms": summary["ttft_mean_ms"],
        "tpot_ms": summary["tpot_mean_ms"],
        "itl_ms": summary["itl_mean_ms"],
        "completed": summary["completed"],
    }


def aiperf(
    args: argparse.Namespace, base_url: str, model: str, out: Path, seed: int
) -> Popen[bytes]:
    argv = [str(args.aiperf), "profile", "--model", model, "--url", base_url.removesuffix("/v1")]
    argv += ["--endpoint-type", "completions", "--streaming", "--tokenizer", str(model_dir())]
    argv += ["--concurrency", str(args.concurrency // 2), "--request-count", str(args.requests)]
    argv += ["--synthetic-input-tokens-mean", str(args.input_len), "--random-seed", str(seed)]
    argv += ["--synthetic-input-tokens-stddev", "0", "--output-tokens-mean", str(args.output_len)]
    argv += ["--output-tokens-stddev", "0", "--extra-inputs", "ignore_eos:true"]
    argv += ["--warmup-request-count", "1", "--ui-type", "none", "--artifact-dir", str(out)]
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    return Popen(argv, env=env, stdout=DEVNULL)


def aiperf_figures(out: Path) -> dict[str, float]:
    found = sorted(out.rglob("profile_export_aiperf.json"))
    if not found:
        raise SystemExit(f"aiperf wrote no profile_export_aiperf.json under {out}")
    data: dict[str, Any] = json.loads(found[-1].read_text())
    metrics = data.get("records", data)
    return {
        "ttft_ms": float(metrics["time_to_first_token"]["avg"]),
        "tpot_ms": float(metrics["inter_token_latency"]["avg"]),
        "completed": float(metrics.get("request_count", {}).get("avg", 0)),
    }


def wait_all(*procs: Popen[bytes]) -> None:
    for proc in procs:
        if proc.wait() != 0:
            raise SystemExit(f"{proc.args!r} failed ({proc.returncode})")


def mean_of(runs: list[dict[str, float]], key: str) -> float:
    return statistics.fmean(r[key] for r in runs if key in r)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aiperf", type=Path, required=True, help="the aiperf executable")
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=4, help="streams, half per client")
    parser.add_argument("--requests", type=int, default=32, help="per client and round")
    parser.add_argument("--repeats", type=int, default=2, help="rounds, both clients at once")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="crescent-aiperf-"))
    stack = Stack.start(work / "crescent", {}, (), 600)
    ours: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    try:
        import httpx

        model = httpx.get(f"{stack.base_url}/models", timeout=10).json()["data"][0]["id"]
        for i in range(args.repeats):
            mine, other = work / f"bench-{i}", work / f"aiperf-{i}"
            # New prompts every round: nothing a round sends is cached from an earlier one.
            wait_all(
                crescent_bench(args, stack.base_url, mine, 1000 + i),
                aiperf(args, stack.base_url, model, other, 2000 + i),
            )
            ours.append(crescent_bench_figures(mine))
            theirs.append(aiperf_figures(other))
            print(f"round {i + 1}: crescent bench {ours[-1]}, aiperf {theirs[-1]}")
    except BaseException:
        print(collect_logs(stack.data_dir), file=sys.stderr)
        raise
    finally:
        stack.stop()
    a = {k: mean_of(ours, k) for k in ("ttft_ms", "tpot_ms", "itl_ms")}
    b = {k: mean_of(theirs, k) for k in ("ttft_ms", "tpot_ms")}
    figures = {
        "crescent_bench": a,
        "aiperf": b,
        "rounds": {"crescent_bench": ours, "aiperf": theirs},
    }
    print(f"{'':24}{'crescent bench':>16}{'aiperf':>12}{'ratio':>8}")
    for key, label in (("ttft_ms", "TTFT mean (ms)"), ("tpot_ms", "ITL/TPOT mean (ms)")):
        print(f"{label:24}{a[key]:16.1f}{b[key]:12.1f}{a[key] / b[key]:8.3f}")
    print(f"{'chunk gaps mean (ms)':24}{a['itl_ms']:16.1f}")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
