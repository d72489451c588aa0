"""Choosing a transport, and what happens where UCX cannot load."""

from __future__ import annotations

import sys

import pytest

import shared.transfer.ucx as ucx
from shared.transfer.base import (
    TransferClient,
    TransferError,
    TransferServer,
    check_kind,
    create_client,
    create_server,
)


def test_only_the_known_kinds_are_accepted() -> None:
    assert check_kind("tcp") == "tcp" and check_kind("ucx") == "ucx"
    with pytest.raises(TransferError, match="unknown transfer kind"):
        check_kind("rdma")
    with pytest.raises(TransferError):
        create_client("rdma")


@pytest.mark.parametrize("kind", ["tcp", "ucx"])
def test_a_server_has_no_address_before_it_starts(kind: str) -> None:
    server: TransferServer = create_server(kind, lambda lease, ids: None)
    client: TransferClient = create_client(kind)
    assert (server.bytes_sent, server.blocks_sent) == (0, 0)
    assert (client.bytes_received, client.blocks_received) == (0, 0)
    with pytest.raises(TransferError, match="not started"):
        _ = server.address


def test_ucx_that_cannot_load_is_a_clear_transfer_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ucx, "_binding", None)
    monkeypatch.setitem(sys.modules, "ucxx", None)  # makes `import ucxx` fail
    with pytest.raises(TransferError, match="CRESCENT_TRANSFER=tcp"):
        create_server("ucx", lambda lease, ids: None)
    with pytest.raises(TransferError, match="cannot import ucxx"):
        create_client("ucx")
