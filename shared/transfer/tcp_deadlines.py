"""How long a TCP server's connection may take to read: between pulls, and within a request.

Deadlines are kept as plain times and swept by one task a few times per shortest timeout,
rather than as a timer per request: a timer costs every pull several microseconds to arm and
disarm, the sweep costs a pull two dictionary updates. A connection is dropped at most a
quarter of its timeout late.
"""

from __future__ import annotations

import socket
import time

# How often the sweep runs at most: a timeout of many seconds needs no finer precision.
MAX_TICK_S = 1.0


class Deadlines:
    """The connections waiting to read, and by when each must have read enough.

    Owns the deadlines only, not the connections. Invariant: a connection is in at most one
    of ``idle`` (waiting for its next request, the longest waiting first) and ``reading`` (in
    the middle of a request), and in neither while it answers.
    """

    def __init__(self, idle_timeout_s: float, read_timeout_s: float) -> None:
        self._idle_s = idle_timeout_s
        self._read_s = read_timeout_s
        self.idle: dict[socket.socket, float] = {}
        self.reading: dict[socket.socket, float] = {}
        self.tick_s = min(MAX_TICK_S, idle_timeout_s / 4, read_timeout_s / 4)

    def wait_for_request(self, conn: socket.socket) -> None:
        self.idle[conn] = time.monotonic() + self._idle_s

    def request_started(self, conn: socket.socket) -> None:
        """The first bytes of a request arrived: the rest must follow within the read timeout."""
        self.idle.pop(conn, None)
        self.reading[conn] = time.monotonic() + self._read_s

    def done(self, conn: socket.socket) -> None:
        self.idle.pop(conn, None)
        self.reading.pop(conn, None)

    def longest_idle(self) -> socket.socket | None:
        return next(iter(self.idle), None)

    def expired(self) -> tuple[list[socket.socket], list[socket.socket]]:
        """The idle and the reading connections past their deadlines, forgotten here."""
        now = time.monotonic()
        idle = [conn for conn, until in self.idle.items() if until < now]
        reading = [conn for conn, until in self.reading.items() if until < now]
        for conn in idle + reading:
            self.done(conn)
        return idle, reading
