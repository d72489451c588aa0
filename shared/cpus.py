"""Core lists as Linux writes them (``0-3,6``). Pure: no I/O."""

from __future__ import annotations


def parse_cpus(text: str) -> set[int]:
    """``"0-3,6"`` as ``{0, 1, 2, 3, 6}``; ``ValueError`` on anything else, or on a range that
    runs backwards."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"{part!r} is not a core or a range of cores such as 0-3")
        lo, hi = int(first), int(last or first)
        if hi < lo:
            raise ValueError(f"the core range {part!r} runs backwards")
        cpus.update(range(lo, hi + 1))
    return cpus
