"""What `crescent up` shows while it starts: one line on stderr per step as it completes, with
its time (``✓ NATS server 0.4 s``); on a terminal a spinner names the step under way, elsewhere
(a log, a pipe) the lines are plain text."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.text import Text


def seconds(elapsed: float) -> str:
    """``0.4 s`` below ten seconds, ``25 s`` above."""
    return f"{elapsed:.1f} s" if elapsed < 10 else f"{elapsed:.0f} s"


class StartupProgress:
    """Owns the stderr console on which the start-up steps are reported."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True, highlight=False, soft_wrap=True)
        utf = (self.console.encoding or "").lower().replace("-", "").startswith("utf")
        self._tick = "✓" if utf else "ok"

    @contextmanager
    def step(self, label: str) -> Iterator[None]:
        """Times the body; prints ``✓ <label> <time>`` once it has returned (not if it raised)."""
        started = time.monotonic()
        if self.console.is_terminal:
            with self.console.status(f"{label}…"):
                yield
        else:
            yield
        line = Text.assemble(
            (self._tick, "green"), f" {label} ", (seconds(time.monotonic() - started), "dim")
        )
        self.console.print(line)

    def stopped(self) -> None:
        self.console.print("crescent up: stopped")
