"""Work started so that its caller need not wait for it, kept track of until it ends."""

from __future__ import annotations

from shared.lifecycle import Tasks


class Background(Tasks):
    """Owns the tasks it started (the one-shot tracker of ``shared.lifecycle``). Invariant: a
    task is held from ``spawn`` until it ends, so none is garbage-collected half-way; one that
    fails is logged and counted in ``failures``; ``close`` leaves none running."""

    def __init__(self, owner: str = "background") -> None:
        super().__init__(owner)
