"""The TCP block server's own tasks: a sweep or an accept that fails is logged, and the server
goes on sweeping and accepting; closing it leaves no task and no socket behind."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import time

import pytest

from shared.transfer.tcp import TcpTransferServer
from shared.transfer.tcp_deadlines import Deadlines
from tests.support.wait import wait_for_condition
from tests.transfer.test_tcp_limits import DEADLINE_S, closed_at, connect, healthy_pull, serving


def test_a_sweep_that_fails_is_logged_and_the_next_one_drops_the_idle(
    run: asyncio.Runner, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed: list[bool] = []
    expired = Deadlines.expired

    def fails_once(self: Deadlines) -> tuple[list[socket.socket], list[socket.socket]]:
        if not failed:
            failed.append(True)
            raise RuntimeError("the sweep broke")
        return expired(self)

    monkeypatch.setattr(Deadlines, "expired", fails_once)

    async def scenario() -> None:
        async with serving(idle_timeout_s=DEADLINE_S) as server:
            silent = await connect(server)
            opened_at = time.monotonic()
            assert await closed_at(silent, 10 * DEADLINE_S) - opened_at > DEADLINE_S * 0.9
            silent.close()

    with caplog.at_level(logging.ERROR, logger="shared.lifecycle"):
        run.run(scenario())
    assert failed
    assert "tcp transfer server: task sweep failed" in caplog.text


def test_an_accept_that_fails_is_logged_and_accepting_goes_on(
    run: asyncio.Runner, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        accept = loop.sock_accept
        refusals: list[bool] = []

        async def out_of_descriptors(sock: socket.socket) -> tuple[socket.socket, object]:
            if not refusals:
                refusals.append(True)
                raise OSError(errno.EMFILE, "Too many open files")
            return await accept(sock)

        loop.sock_accept = out_of_descriptors  # type: ignore[method-assign]
        try:
            async with serving() as server:
                await healthy_pull(server)
        finally:
            del loop.sock_accept
        assert refusals

    with caplog.at_level(logging.ERROR, logger="shared.lifecycle"):
        run.run(scenario())
    assert "tcp transfer server: task accept failed" in caplog.text


def test_closing_ends_every_connection_and_the_listening_socket(run: asyncio.Runner) -> None:
    async def scenario() -> None:
        server = TcpTransferServer(lambda lease, ids: None)
        await server.start()
        clients = [await connect(server) for _ in range(3)]
        await wait_for_condition(lambda: server.connections == 3, "three connections served")
        await server.close()
        assert server.connections == 0
        for sock in clients:
            await closed_at(sock, 2.0)
            sock.close()
        with pytest.raises(ConnectionRefusedError):
            await connect(server)
        await server.close()  # a second close is harmless

    run.run(scenario())
