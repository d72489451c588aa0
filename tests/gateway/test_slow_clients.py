"""Slow and idle clients against a real gateway on loopback: header, body and keep-alive
deadlines close them, the connection cap refuses what is over it, and a normal client is
served meanwhile."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import gateway_settings
from tests.support.fake_engine import FakeEngine
from tests.support.gateway import ServedGateway
from tests.support.loop import BackgroundLoop
from tests.support.wait import wait_until

HEADER_S, BODY_S, IDLE_S = 0.6, 1.0, 0.5
#: How much later than its deadline a connection may close on a busy two-core machine.
SLACK_S = 4.0
EACH = 70  # idle, slow-header and slow-body connections: 210 in all


@pytest.fixture(scope="module")
def strict(
    bg_loop: BackgroundLoop, nats_url: str, cache_dir: Path, fake_engine: FakeEngine
) -> Iterator[ServedGateway]:
    settings = gateway_settings(
        nats_url, cache_dir, header_timeout_s=HEADER_S, body_timeout_s=BODY_S,
        keep_alive_timeout_s=IDLE_S, max_connections=400,
    )  # fmt: skip
    served = ServedGateway(bg_loop, settings).start()
    yield served
    served.stop()


@pytest.fixture(scope="module")
def capped(
    bg_loop: BackgroundLoop, nats_url: str, cache_dir: Path, fake_engine: FakeEngine
) -> Iterator[ServedGateway]:
    served = ServedGateway(bg_loop, gateway_settings(nats_url, cache_dir, max_connections=8))
    yield served.start()
    served.stop()


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_until_closed(sock: socket.socket, deadline: float) -> bytes:
    """What the server sent before closing; fails if it is still open at ``deadline``."""
    got = b""
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            part = sock.recv(65536)
        except ConnectionResetError:
            return got
        except TimeoutError:
            pytest.fail(f"the connection is still open after its deadline; got {got[:80]!r}")
        if not part:
            return got
        got += part


class Trickle:
    """Sends one more header byte on each slow-header socket every 100 ms, as slowloris does,
    until stopped or the socket is closed."""

    def __init__(self, socks: list[socket.socket]) -> None:
        self.socks = socks
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            for sock in self.socks:
                try:
                    sock.send(b"x")
                except OSError:
                    continue


def test_idle_slow_header_and_slow_body_connections_are_closed(strict: ServedGateway) -> None:
    started = time.monotonic()
    idle = [connect(strict.port) for _ in range(EACH)]
    slow_headers = [connect(strict.port) for _ in range(EACH)]
    for sock in slow_headers:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nX-Slow: ")
    slow_bodies = [connect(strict.port) for _ in range(EACH)]
    head = b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
    for sock in slow_bodies:
        sock.sendall(head + b'Content-Length: 1000\r\n\r\n{"model":')
    trickle = Trickle(slow_headers)
    try:
        # A normal client is served while the slow ones are held.
        asked = time.monotonic()
        answer = httpx.get(f"{strict.url}/livez", timeout=5)
        assert answer.status_code == 200
        assert time.monotonic() - asked < 1.0
        for sock in idle + slow_headers:
            read_until_closed(sock, started + HEADER_S + SLACK_S)
        for sock in slow_bodies:
            assert read_until_closed(sock, started + BODY_S + SLACK_S).startswith(b"HTTP/1.1 408")
    finally:
        trickle.stop.set()
        for sock in idle + slow_headers + slow_bodies:
            sock.close()
    with httpx.Client(base_url=strict.url, timeout=5) as client:
        assert client.get("/livez").status_code == 200  # still serving after all that


def test_an_idle_keep_alive_connection_is_closed(strict: ServedGateway) -> None:
    sock = connect(strict.port)
    try:
        sock.sendall(b"GET /livez HTTP/1.1\r\nHost: gw\r\n\r\n")
        answered = time.monotonic()
        got = read_until_closed(sock, answered + IDLE_S + SLACK_S)
        assert got.startswith(b"HTTP/1.1 200")
        # Closed for idleness, not at once after the response.
        assert time.monotonic() - answered >= IDLE_S * 0.8
    finally:
        sock.close()


def test_connections_over_the_cap_get_503_and_are_closed(capped: ServedGateway) -> None:
    held = [connect(capped.port) for _ in range(8)]
    try:
        # The server has accepted them all once a request on a ninth socket is refused.
        extra = connect(capped.port)
        refused = read_until_closed(extra, time.monotonic() + SLACK_S)
        extra.close()
        assert refused.startswith(b"HTTP/1.1 503")
    finally:
        for sock in held:
            sock.close()

    # With the held connections gone, new ones are served again.
    def serving() -> bool:
        try:
            return httpx.get(f"{capped.url}/livez", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(serving, "the gateway to accept connections again")
