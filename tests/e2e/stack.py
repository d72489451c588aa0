"""A whole Crescent stack started the way a user starts it: `crescent up`, as a process (the
launcher the benchmarks and the chaos suite use too)."""

from __future__ import annotations

from bench.faults import Stack, collect_logs
from crescent.procfs import marked as processes_marked

__all__ = ["Stack", "collect_logs", "processes_marked"]
