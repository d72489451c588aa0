"""Ctrl-C and SIGTERM in `crescent up`: a stop asked for at any time, start-up included."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class Stopped(Exception):
    """A stop was asked for before the stack was ready."""


class StopSignals:
    """Owns the SIGINT and SIGTERM handlers of `crescent up`. A signal sets ``flag[0]`` (the
    flag the waits of start-up and the supervisor poll); inside ``interruptible()``, around
    work that starts no process (checking or converting the model), it also raises
    ``Stopped`` at once."""

    def __init__(self) -> None:
        self.flag = [False]
        self._raise = False
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.flag[0] = True
        if self._raise:
            self._raise = False
            raise Stopped

    @property
    def requested(self) -> bool:
        return self.flag[0]

    def check(self) -> None:
        """Raises ``Stopped`` if a stop was asked for."""
        if self.flag[0]:
            raise Stopped

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        self.check()
        self._raise = True
        try:
            yield
        finally:
            self._raise = False
