"""The test tiers, by where a test lives: ``-m unit`` (pure cores, no server), ``-m
integration`` (one part against real servers or the real model), ``-m e2e`` (a whole stack
over HTTP) and ``-m chaos`` (a whole stack with faults injected)."""

from __future__ import annotations

from pathlib import Path

TIERS = ("unit", "integration", "e2e", "chaos")
TESTS = Path(__file__).resolve().parents[1]
_UNIT_DIRS = frozenset({"unit", "bench"})


def tier_of(path: Path) -> str:
    """The tier of the test file at ``path`` (under ``tests/``)."""
    parts = path.resolve().relative_to(TESTS).parts
    if parts[0] == "chaos":
        return "chaos"
    if parts[0] == "e2e" or path.stem.endswith("_e2e"):
        return "e2e"
    return "unit" if parts[0] in _UNIT_DIRS else "integration"
