"""``crescent up`` gives each of its processes a port none of the others was given: a port
chosen free is bound only once its child has started, so the kernel may offer it twice."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from crescent import s3_server, up


class _Offers:
    """A socket whose bind to port 0 is given the next port of a fixed sequence, as a kernel
    may hand out a port again that was released a moment before."""

    def __init__(self, ports: Iterator[int]) -> None:
        self._ports = ports
        self._port = 0

    def __enter__(self) -> _Offers:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def bind(self, address: tuple[str, int]) -> None:
        self._port = address[1] or next(self._ports)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self._port)

    def close(self) -> None:
        pass


def _kernel_offers(monkeypatch: pytest.MonkeyPatch, module: Any, ports: list[int]) -> None:
    offered = iter(ports)
    monkeypatch.setattr(module.socket, "socket", lambda *a, **k: _Offers(offered))


def test_a_port_given_out_or_the_gateways_is_never_given_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(up, "_taken", {8000})
    _kernel_offers(monkeypatch, up, [8000, 41000, 41000, 41001])
    assert [up._free_port(), up._free_port()] == [41000, 41001]


def test_the_s3_servers_ports_avoid_those_given_to_the_stack(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    offset = s3_server.GRPC_OFFSET
    taken = {40000, 41000 + offset}
    offers = [40000, 41000]  # the first is taken, the second's gRPC pair is
    offers += [42000 + n for n in range(len(s3_server.COMPONENTS))]
    _kernel_offers(monkeypatch, s3_server, offers)
    ports = s3_server.free_ports(avoid=taken)
    assert not set(ports.values()) & taken
    assert ports[f"{s3_server.COMPONENTS[0]}.port"] == 42000
    assert len(set(ports.values())) == 2 * len(s3_server.COMPONENTS)


def test_real_free_ports_do_not_repeat() -> None:
    given = [up._free_port() for _ in range(50)]
    assert len(set(given)) == 50
    with socket.socket() as s:
        s.bind(("127.0.0.1", given[0]))  # still free: given out, not held
