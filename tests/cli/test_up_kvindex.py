"""Where `crescent up` puts kvindex: 8091 when free and nothing else is asked for (kvindex
falling back to a free port should another stack take it first, and saying which), a free port
when 8091 is taken (a second stack still starts), exactly the configured port otherwise, and a
taken or malformed one refused with the variable to change. What it tells of the token."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from crescent import up_kvindex
from crescent.up_kvindex import KvIndexPlace, landed, place, summary
from crescent.up_port import PortTaken


@pytest.fixture
def held() -> Iterator[int]:
    """A loopback port this process listens on for the test."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def released() -> int:
    """A loopback port free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_default_port_when_free_else_a_free_one(held: int) -> None:
    free = released()
    assert place({}, lambda: 1, default=free) == KvIndexPlace("127.0.0.1", free, fallback=True)
    assert place({}, lambda: 41234, default=held) == KvIndexPlace("127.0.0.1", 41234)
    assert up_kvindex.DEFAULT_PORT == 8091


def test_a_configured_port_is_kept_and_zero_takes_a_free_one() -> None:
    port = released()
    env = {"CRESCENT_KVINDEX_PORT": str(port), "CRESCENT_KVINDEX_HOST": "127.0.0.1"}
    assert place(env, lambda: 1) == KvIndexPlace("127.0.0.1", port)
    assert place({"CRESCENT_KVINDEX_PORT": "0"}, lambda: 41234).port == 41234


def test_a_configured_port_that_is_taken_is_refused_naming_the_variable(held: int) -> None:
    with pytest.raises(PortTaken) as refused:
        place({"CRESCENT_KVINDEX_PORT": str(held)}, lambda: 1)
    message = str(refused.value)
    assert f"port {held} is taken by pid {os.getpid()}" in message
    assert "CRESCENT_KVINDEX_PORT" in message and "--port" not in message


@pytest.mark.parametrize("value", ["http", "-1", "70000"])
def test_a_malformed_port_is_refused(value: str) -> None:
    with pytest.raises(PortTaken, match="is not a port"):
        place({"CRESCENT_KVINDEX_PORT": value}, lambda: 1)


def test_the_children_environment_names_the_place_and_the_summary_the_token() -> None:
    where = KvIndexPlace("::1", 8091)
    assert where.url == "http://[::1]:8091"
    assert where.env() == {"CRESCENT_KVINDEX_HOST": "::1", "CRESCENT_KVINDEX_PORT": "8091"}
    falls_back = KvIndexPlace("::1", 8091, fallback=True).env()
    assert falls_back["CRESCENT_KVINDEX_PORT_FALLBACK"] == "true"
    assert where.where(9123) == {
        "kvindex": "http://[::1]:8091",
        "kvindex_metrics": "http://127.0.0.1:9123/metrics",
    }
    by_file = summary(where, {"CRESCENT_CACHEMETA_TOKEN_FILE": "/data/secrets/cachemeta.token"})
    assert by_file.startswith("http://[::1]:8091/v1/kv/query ")
    assert "/data/secrets/cachemeta.token" in by_file
    secret = "s3cr3t-token-value"
    by_value = summary(where, {"CRESCENT_CACHEMETA_TOKEN": secret})
    assert "CRESCENT_CACHEMETA_TOKEN" in by_value and secret not in by_value
    assert "no token" in summary(where, {})


def test_where_kvindex_landed_is_the_port_it_wrote(tmp_path: Path) -> None:
    where = KvIndexPlace("127.0.0.1", 8091, fallback=True)
    assert landed(where, tmp_path) == where  # nothing written: as asked
    (tmp_path / up_kvindex.PORT_FILE).write_text("41235\n")
    assert landed(where, tmp_path) == KvIndexPlace("127.0.0.1", 41235)
