"""``crescent status [--watch]``: the picture of the gateway's /dashboard in the terminal, read
from the ``/status`` of any running gateway (a `crescent up` stack, docker-compose, a cluster)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from crescent.up_lock import LOCK_NAME, default_data_dir, running_stack

HEALTH_STYLE = {"ok": "green", "draining": "yellow", "unhealthy": "bold red", "silent": "red"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        default=None,
        help="the gateway's base URL (default: the API of the `crescent up` stack running from "
        "--data-dir)",
    )
    p.add_argument("--data-dir", type=Path, default=None, help="a `crescent up` data folder")
    p.add_argument("--watch", action="store_true", help="redraw until Ctrl-C")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between redraws")


def run(args: argparse.Namespace) -> int:
    folder = (args.data_dir or default_data_dir()).expanduser()
    url = _status_url(args.url, folder)
    if url is None:
        sys.stderr.write(
            f"crescent status: no stack found from {folder}; "
            "start one with `crescent up` or pass --url\n"
        )
        return 1
    console = Console()
    if not args.watch:
        try:
            console.print(render(fetch(url)))
        except OSError as exc:
            sys.stderr.write(f"crescent status: error: {url}: {exc}\n")
            if args.url is None:
                sys.stderr.write(f"crescent status: is the stack from {folder} still starting?\n")
            return 1
        return 0
    from rich.live import Live

    with Live(console=console, auto_refresh=False) as live:
        try:
            while True:
                try:
                    view: Any = render(fetch(url))
                except OSError as exc:
                    view = Text(f"{url}: {exc}", style="red")
                live.update(view, refresh=True)
                time.sleep(max(args.interval, 0.2))
        except KeyboardInterrupt:
            return 0


def _status_url(url: str | None, folder: Path) -> str | None:
    if url is None:
        url = _stack_api(folder)
    return None if url is None else url.rstrip("/") + "/status"


def _stack_api(folder: Path) -> str | None:
    """The base URL of the `crescent up` stack running from ``folder``, from the record in
    its lock file; from ``stack.json`` in a folder without a lock file (kept by a stack of
    an earlier version)."""
    record = running_stack(folder)
    if record is not None:
        return record.url
    stack = folder / "stack.json"
    if (folder / LOCK_NAME).exists() or not stack.exists():
        return None
    return str(json.loads(stack.read_text())["api"]).removesuffix("/v1")


def fetch(url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """The status document; ``OSError`` (``urllib.error.URLError`` among them) when the
    gateway cannot be reached or answers with an error."""
    with urllib.request.urlopen(url, timeout=timeout_s) as reply:
        doc: dict[str, Any] = json.loads(reply.read())
    return doc


def render(doc: dict[str, Any]) -> Group:
    """The status document as rich tables: the roles' saturation, nodes, tiers, cache,
    recent requests."""
    gateway = doc["gateway"]
    stamp = time.strftime("%H:%M:%S", time.gmtime(doc["generated_at"]))
    title = Text.assemble(
        ("Crescent ", "bold"),
        f"{gateway.get('id', '?')} · {gateway.get('model', '?')} · "
        f"{gateway.get('in_flight', 0)} in flight · {stamp} UTC",
    )
    roles = _roles(doc.get("saturation", {}))
    return Group(title, roles, _nodes(doc["nodes"]), _tiers(doc["tiers"]), _cache(doc["cache"]),
                 _requests(doc["requests"]))  # fmt: skip


def _roles(saturation: dict[str, float | None]) -> Text:
    """Each role's saturation, the figure autoscalers scale it on (a gateway of an earlier
    version sends none)."""
    figures = " · ".join(f"{role} {percent(value)}" for role, value in saturation.items())
    return Text(f"role saturation (100% is at the objective): {figures or '–'}")


def percent(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f}%"


def ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f} ms"


def size(num_bytes: float) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    i = 0
    while num_bytes >= 1024 and i < len(units) - 1:
        num_bytes /= 1024
        i += 1
    return f"{num_bytes:.1f} {units[i]}"


def _nodes(nodes: list[dict[str, Any]]) -> Table:
    table = Table(title="Nodes", title_justify="left", expand=True)
    table.add_column("service", no_wrap=True)
    for name in ("role", "health"):
        table.add_column(name)
    for name in ("running", "queued tokens", "pool use", "pool blocks", "saturation",
                 "last seen"):  # fmt: skip
        table.add_column(name, justify="right")
    for n in nodes:
        total = n["pool_total_blocks"]
        used = f"{n['pool_used_blocks']}/{total}" if total else "–"
        table.add_row(
            n["id"], n["role"], Text(n["health"], style=HEALTH_STYLE.get(n["health"], "")),
            str(n["running_seqs"]), str(n["queued_tokens"]), percent(n["pool_use"]), used,
            percent(n.get("saturation")), f"{n['last_seen_s']:.1f} s",
        )  # fmt: skip
    return table


def _tiers(tiers: list[dict[str, Any]]) -> Table:
    table = Table(title="Tiers", title_justify="left", expand=True)
    table.add_column("tierd")
    table.add_column("tier")
    for name in ("used", "capacity", "use"):
        table.add_column(name, justify="right")
    for t in tiers:
        capacity = size(t["capacity_bytes"]) if t["capacity_bytes"] else "unbounded"
        table.add_row(t["node"], t["tier"], size(t["used_bytes"]), capacity, percent(t["use"]))
    return table


def _cache(cache: dict[str, Any]) -> Table:
    table = Table(title="Cache hit ratio", title_justify="left", expand=True)
    table.add_column("since (UTC)")
    for name in ("prompt tokens", "cached tokens", "hit ratio"):
        table.add_column(name, justify="right")
    for point in cache["history"][-10:]:
        table.add_row(
            time.strftime("%H:%M:%S", time.gmtime(point["t"])), str(point["prompt_tokens"]),
            str(point["cached_tokens"]), percent(point["hit_ratio"]),
        )  # fmt: skip
    minutes = round(cache["window_s"] / 60)
    table.add_row(
        Text(f"last {minutes} min", style="bold"), str(cache["prompt_tokens"]),
        str(cache["cached_tokens"]), Text(percent(cache["hit_ratio"]), style="bold"),
    )  # fmt: skip
    return table


def _requests(requests: list[dict[str, Any]]) -> Table:
    table = Table(title="Recent requests", title_justify="left", expand=True)
    table.add_column("ended (UTC)")
    for name in ("TTFT", "TPOT", "end to end", "prompt", "cached"):
        table.add_column(name, justify="right")
    for r in requests[:10]:
        table.add_row(
            time.strftime("%H:%M:%S", time.gmtime(r["ended_at"])), ms(r["ttft_ms"]),
            ms(r["tpot_ms"]), ms(r["e2e_ms"]), str(r["prompt_tokens"]), str(r["cached_tokens"]),
        )  # fmt: skip
    return table
