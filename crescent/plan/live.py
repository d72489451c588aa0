"""Reads a running cluster's workload from its gateways: ``/metrics`` at both ends of a window
and ``/status`` at its end (``observe`` makes the observation of them)."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from crescent.plan.observe import Observation, observe
from crescent.status import fetch as fetch_status
from crescent.up_lock import default_data_dir, running_stack


def gateway_urls(urls: Sequence[str] | None, data_dir: Path | None) -> list[str]:
    """The gateways' base URLs: those given, else the `crescent up` stack's from its data
    folder's lock record (none when no stack runs there)."""
    if urls:
        return [u.rstrip("/") for u in urls]
    record = running_stack((data_dir or default_data_dir()).expanduser())
    return [] if record is None else [record.url.rstrip("/")]


def scrape(url: str, timeout_s: float = 5.0) -> str:
    """The text of a gateway's ``/metrics``; ``OSError`` when it cannot be read."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=timeout_s) as reply:
        return str(reply.read().decode("utf-8"))


def watch(
    urls: Sequence[str],
    window_s: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Observation:
    """What ``urls`` counted over ``window_s`` seconds (the window measured, not assumed:
    the scrapes themselves take time)."""
    started = clock()
    before = [scrape(u) for u in urls]
    sleep(window_s)
    after = [scrape(u) for u in urls]
    elapsed = clock() - started
    statuses = [fetch_status(f"{u}/status") for u in urls]
    return observe(before, after, elapsed, statuses)
