"""The ops port answers ``/healthz`` with many idle connections open, drops clients that send
nothing, and closes connections past its cap at once."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from prometheus_client import CollectorRegistry, Counter

from shared.ops_http import OpsServer
from tests.support.wait import wait_until


@contextmanager
def serving(**options: float) -> Iterator[OpsServer]:
    registry = CollectorRegistry()
    Counter("crescent_test_things", "things", registry=registry).inc(3)
    server = OpsServer("127.0.0.1", 0, lambda: True, registry, **options)  # type: ignore[arg-type]
    server.start()
    try:
        yield server
    finally:
        server.stop()


def idle(server: OpsServer, stack: ExitStack) -> socket.socket:
    conn = stack.enter_context(socket.create_connection(("127.0.0.1", server.port), timeout=5))
    conn.sendall(b"GET /healthz HTTP/1.1\r\n")  # a request line, then nothing more
    return conn


def handlers() -> int:
    """Connection threads of the ops servers in this process; the test's server adds one per
    connection it holds a slot for (compare with a count taken before)."""
    return sum(t.name.endswith("(process_request_thread)") for t in threading.enumerate())


def still_open(conn: socket.socket) -> bool:
    """Whether the server has not closed ``conn`` (it sends these idle ones nothing)."""
    conn.setblocking(False)
    try:
        return conn.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    finally:
        conn.settimeout(5)


def healthz(server: OpsServer, timeout_s: float = 1.0) -> tuple[int, bytes, float]:
    started = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=timeout_s) as r:
        return r.status, r.read(), time.monotonic() - started


def test_healthz_answers_with_fifty_idle_connections_open() -> None:
    with serving() as server, ExitStack() as stack:
        before = handlers()
        for _ in range(50):
            idle(server, stack)
        wait_until(lambda: handlers() >= before + 50, "every idle connection to take its thread")
        status, body, seconds = healthz(server)
        assert (status, body) == (200, b"ok\n")
        assert seconds < 1.0
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=1) as r:
            assert b"crescent_test_things_total 3.0" in r.read()


def test_a_silent_client_is_dropped_after_the_read_timeout() -> None:
    with serving(read_timeout_s=0.3) as server, ExitStack() as stack:
        conn = idle(server, stack)
        started = time.monotonic()
        assert conn.recv(1024) == b""  # closed by the server, without an answer
        assert 0.2 < time.monotonic() - started < 3.0


def test_past_the_cap_a_connection_is_closed_at_once_and_slots_come_back() -> None:
    with serving(read_timeout_s=2.0, max_connections=4) as server, ExitStack() as stack:
        before = handlers()
        held = [idle(server, stack) for _ in range(4)]
        wait_until(lambda: handlers() >= before + 4, "four idle connections to take every slot")
        extra = idle(server, stack)
        assert extra.recv(1024) == b""
        # At once, not after the read timeout: the older idle ones are still open.
        assert all(still_open(conn) for conn in held)
        wait_until(lambda: handlers() <= before, "the idle ones to time out and free slots")
        assert healthz(server)[:2] == (200, b"ok\n")
