"""The UCX endpoint cache and settings, without UCX: fake endpoints that fail on command."""

from __future__ import annotations

import pytest

from shared.transfer import ucx_endpoints
from shared.transfer.base import TransferError
from shared.transfer.ucx_endpoints import FAILED_HOLD_S, MAX_FAILED, Endpoints, PeerGoneError
from shared.transfer.ucx_settings import UcxSettings, apply_defaults, ucx_defaults


class FakeEndpoint:
    """An endpoint that UCX "fails" when a test sets ``alive`` to False."""

    def __init__(self, address: bytes) -> None:
        self.address = address
        self.alive = True
        self.closed = False

    def close_blocking(self, period: int, max_attempts: int) -> None:
        assert not self.closed, "closed twice"
        self.closed = True


class Maker:
    """Makes fake endpoints and remembers each."""

    def __init__(self) -> None:
        self.made: list[FakeEndpoint] = []

    def __call__(self, address: bytes) -> FakeEndpoint:
        self.made.append(FakeEndpoint(address))
        return self.made[-1]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(ucx_endpoints, "time", fake)
    return fake


def test_a_failed_endpoint_is_closed_and_never_handed_out_again(clock: Clock) -> None:
    maker = Maker()
    endpoints = Endpoints(maker)
    first = endpoints.get(b"a")
    assert endpoints.get(b"a") is first and len(maker.made) == 1  # cached while it works
    first.alive = False
    assert endpoints.failed(b"a")
    with pytest.raises(PeerGoneError):
        endpoints.get(b"a")
    assert first.closed and b"a" not in endpoints
    clock.now += FAILED_HOLD_S / 2
    with pytest.raises(PeerGoneError):  # still refused: no endpoint made meanwhile
        endpoints.get(b"a")
    assert len(maker.made) == 1
    clock.now += FAILED_HOLD_S
    assert not endpoints.failed(b"a")
    second = endpoints.get(b"a")  # a peer that lost its connection, not its life
    assert second is not first and not second.closed


def test_endpoints_that_fail_while_idle_are_swept_by_the_next_new_peer(clock: Clock) -> None:
    endpoints = Endpoints(FakeEndpoint)
    gone = [endpoints.get(bytes([i])) for i in range(5)]
    for ep in gone[:3]:
        ep.alive = False  # e.g. clients that died between pulls, never asked for again
    endpoints.get(b"new")
    assert [ep.closed for ep in gone] == [True, True, True, False, False]
    assert all(bytes([i]) not in endpoints for i in range(3))
    assert endpoints.drop_failed() == 0


def test_failed_addresses_are_remembered_within_bounds(clock: Clock) -> None:
    endpoints = Endpoints(FakeEndpoint)
    for i in range(MAX_FAILED + 10):
        endpoints.get(i.to_bytes(4, "big")).alive = False
        assert endpoints.drop_failed() == 1
    assert endpoints.failed((MAX_FAILED + 9).to_bytes(4, "big"))
    assert not endpoints.failed((9).to_bytes(4, "big"))  # the oldest made room
    assert endpoints.failed((10).to_bytes(4, "big"))


def test_error_handling_mode_comes_from_the_environment_and_defaults_to_peer() -> None:
    def mode_from(environ: dict[str, str]) -> str:
        return UcxSettings.from_environ(environ).ucx_error_handling

    assert mode_from({}) == "peer"
    assert mode_from({"CRESCENT_UCX_ERROR_HANDLING": " OFF "}) == "off"
    with pytest.raises(TransferError, match="CRESCENT_UCX_ERROR_HANDLING"):
        mode_from({"CRESCENT_UCX_ERROR_HANDLING": "none"})


def test_ucx_settings_are_defaults_that_the_environment_overrides() -> None:
    env = {"UCX_KEEPALIVE_INTERVAL": "5s"}
    apply_defaults("peer", env)
    assert env["UCX_KEEPALIVE_INTERVAL"] == "5s"
    assert env["UCX_PROTO_ENABLE"] == "y"
    assert env["UCX_MM_ERROR_HANDLING"] == "y"
    assert ucx_defaults("off")["UCX_PROTO_ENABLE"] == "n"
    assert "UCX_MM_ERROR_HANDLING" not in ucx_defaults("off")
