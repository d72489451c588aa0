"""Which cores a model process runs on and how many threads torch uses there.

Several Crescent processes often share a host (`crescent up` runs a prefill and a decode node
beside the control plane). Each one sizing its thread pool to every core of the machine makes
them fight over the cores; ``CRESCENT_CPU_AFFINITY`` pins a process to its own, and
``CRESCENT_NUM_THREADS`` sizes its pool (by default, to those cores; unpinned, torch's own
choice).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from shared.cpus import parse_cpus


def apply_thread_settings(num_threads: int | None, cpu_affinity: str | None) -> int:
    """Pins this process to ``cpu_affinity`` (if given) and sets torch's thread count to
    ``num_threads``, else to the number of cores it is pinned to; with neither, torch's own
    count stands. Returns the count."""
    if cpu_affinity:
        os.sched_setaffinity(0, parse_cpus(cpu_affinity))
    count = num_threads or (len(os.sched_getaffinity(0)) if cpu_affinity else None)
    if count is not None:
        torch.set_num_threads(count)
    return torch.get_num_threads()


def set_step_threads(count: int) -> None:
    """Runs the next parallel work of this process on ``count`` threads."""
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)


def step_threads() -> int:
    """How many threads this process computes with now."""
    return torch.get_num_threads()


_SCHEDSTAT = Path("/proc/thread-self/schedstat")


def run_delay_s() -> float:
    """Seconds the calling thread has spent runnable but waiting for a core, by the kernel's
    scheduler statistics; 0.0 where the kernel does not keep them."""
    try:
        return int(_SCHEDSTAT.read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0
