"""One benchmark on two revisions of Crescent, side by side in one run.

The base revision is checked out into a temporary git worktree and given this checkout's
``bench/`` (the same measuring code for both); each run starts from its tree with
``PYTHONPATH`` pointing at it, so it imports (and each stack it starts runs) that tree's
code. The revisions take turns, ``--rounds`` times each, and each figure is the median of its
revision's runs: drift in a shared machine's speed lands on both alike.

    .venv/bin/python bench/revisions.py --base f21d0ae engine [-- --runs 3]
    .venv/bin/python bench/revisions.py --base f21d0ae served [-- --requests 8]

``engine`` runs ``bench/engine.py --crescent-only``; ``served`` runs ``bench/served.py``
(its engine alone and one ``crescent up``). The head is this working tree as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]


def _engine_figures(out: Path) -> dict[str, float]:
    return {name: sides["Crescent"] for name, sides in json.loads(out.read_text()).items()}


def _served_figures(out: Path) -> dict[str, float]:
    data = json.loads(out.read_text())
    stack = next(iter(data["stacks"].values()))
    cold = stack["cold"]
    figures = {
        "TTFT, fresh prompt (ms)": statistics.median(r["ttft_s"] for r in cold) * 1000,
        "inter-token latency (ms)": statistics.median(r["itl_s"] for r in cold) * 1000,
        "full hit TTFT (ms)": statistics.median(r["ttft_s"] for r in stack["hits"]) * 1000,
    }
    alone = data.get("engine_alone")
    if alone:
        figures["engine alone: prefill (ms)"] = alone["prefill_s"] * 1000
        figures["engine alone: decode step (ms)"] = alone["decode_step_s"] * 1000
        figures["engine alone: full hit (ms)"] = alone["hit_prefill_s"] * 1000
    return figures


BENCHES: dict[str, tuple[list[str], str, Callable[[Path], dict[str, float]]]] = {
    "engine": (["bench/engine.py", "--crescent-only"], "--json", _engine_figures),
    "served": (["bench/served.py"], "--out", _served_figures),
}


def _run(tree: Path, bench: str, extra: list[str]) -> dict[str, float]:
    script, out_flag, read = BENCHES[bench]
    with tempfile.TemporaryDirectory(prefix="crescent-rev-") as tmp:
        out = Path(tmp) / "figures.json"
        env = os.environ | {"PYTHONPATH": str(tree)}
        cmd = [sys.executable, str(tree / script[0]), *script[1:], out_flag, str(out), *extra]
        subprocess.run(cmd, cwd=tree, env=env, check=True)
        return read(out)


def _worktree(rev: str, where: Path) -> Path:
    tree = where / "base"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev],
        check=True,
        capture_output=True,
    )
    shutil.rmtree(tree / "bench")
    shutil.copytree(ROOT / "bench", tree / "bench", ignore=shutil.ignore_patterns("__pycache__"))
    return tree


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the revision to compare against")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("bench", choices=sorted(BENCHES))
    parser.add_argument("extra", nargs="*", help="arguments of the benchmark (after --)")
    args = parser.parse_args()
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    base_sha = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", args.base], capture_output=True, text=True
    ).stdout.strip()
    runs: dict[str, list[dict[str, float]]] = {"base": [], "head": []}
    with tempfile.TemporaryDirectory(prefix="crescent-base-") as tmp:
        base_tree = _worktree(args.base, Path(tmp))
        try:
            for _ in range(args.rounds):
                runs["base"].append(_run(base_tree, args.bench, args.extra))
                runs["head"].append(_run(ROOT, args.bench, args.extra))
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)],
                check=False,
            )
    _report(args.bench, f"base {base_sha}", f"head {head} + working tree", runs)
    return 0


def _report(bench: str, base: str, head: str, runs: dict[str, list[dict[str, float]]]) -> None:
    table = Table(title=f"{bench}: medians of {len(runs['base'])} runs each, turn by turn")
    for column in ("figure", base, head, "head / base"):
        table.add_column(column, justify="right")
    medians: dict[str, Any] = {
        side: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for side, rs in runs.items()
    }
    for name, value in medians["base"].items():
        new = medians["head"][name]
        table.add_row(name, f"{value:.1f}", f"{new:.1f}", f"{new / value:.3f}")
    Console(width=110).print(table)


if __name__ == "__main__":
    raise SystemExit(main())
