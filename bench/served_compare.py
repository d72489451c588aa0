"""`bench/served.py` on two versions of the code, side by side in one run: a commit (checked out
in a temporary worktree) and this checkout, in alternating order over ``--rounds`` rounds so a
drift of the machine falls on both. Prints each figure's median per version, the spread of the
rounds' medians (the noise), and the ratio after/before.

    .venv/bin/python bench/served_compare.py --before REF [--rounds 2] [--requests 8]
        [--prompt-tokens 512] [--max-tokens 64] [--out FILE]

Each version runs with this checkout's interpreter and packages; only the code differs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.served import medians  # noqa: E402


def run_version(checkout: Path, passthrough: list[str], out: Path) -> dict[str, Any]:
    """One `served.py` run from ``checkout`` (its own code for the stack it starts)."""
    argv = [sys.executable, "bench/served.py", "--no-engine-alone", "--out", str(out)]
    subprocess.run([*argv, *passthrough], cwd=checkout, check=True)
    stacks: dict[str, Any] = json.loads(out.read_text())["stacks"]
    return stacks["default"]


def figures(result: dict[str, Any]) -> dict[str, float]:
    """The medians ``served.py`` prints for one stack, and its full-hit TTFT."""
    out = medians(result["cold"])
    out["full hit: ttft_s"] = statistics.median(h["ttft_s"] for h in result["hits"])
    return out


def compare(rounds: dict[str, list[dict[str, float]]]) -> list[tuple[str, list[str]]]:
    """Rows of (figure, [before, spread, after, spread, after/before]) in milliseconds, for
    the figures every round of both versions has (a phase some requests skip, such as a
    hand-off in a stack that prefills short prompts on the decode node, is left out)."""
    runs = [r for version in ("before", "after") for r in rounds[version]]
    names = sorted(set.intersection(*(set(r) for r in runs))) if runs else []
    rows = []
    for name in names:
        cells, mids = [], []
        for version in ("before", "after"):
            values = [r[name] for r in rounds[version]]
            mid = statistics.median(values)
            mids.append(mid)
            cells += [f"{mid * 1000:.1f}", f"{min(values) * 1000:.1f}-{max(values) * 1000:.1f}"]
        ratio = f"{mids[1] / mids[0]:.2f}" if mids[0] else "-"
        rows.append((name, [*cells, ratio]))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", required=True, help="the commit to compare against")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args, passthrough = parser.parse_known_args()
    rounds: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        worktree = Path(tmp) / "before"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(worktree), args.before], cwd=ROOT, check=True
        )
        try:
            checkouts = {"before": worktree, "after": ROOT}
            for i in range(args.rounds):
                order = ("before", "after") if i % 2 == 0 else ("after", "before")
                for version in order:
                    out = Path(tmp) / f"{version}-{i}.json"
                    result = run_version(checkouts[version], passthrough, out)
                    rounds[version].append(figures(result))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT)
    table = Table(title=f"served.py, {args.before} vs this checkout (medians, ms)")
    for column in ("figure", "before", "spread", "after", "spread", "after/before"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    for name, cells in compare(rounds):
        table.add_row(name, *cells)
    Console(width=110).print(table)
    if args.out is not None:
        args.out.write_text(json.dumps(rounds, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
