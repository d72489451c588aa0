"""Real faults against a live stack, asserted on the clients' side: every request sent
completes, with not one token duplicated or missing against the fault-free run."""

from __future__ import annotations

import pytest

from bench import chaos as scenarios
from bench.faults import Tally
from tests.chaos.conftest import Chaos


def assert_clean(result: Tally) -> None:
    assert result.errors == () and result.failed == 0, result
    assert result.completed == result.sent and result.sent > 0, result
    assert (result.duplicated, result.missing) == (0, 0), result


@pytest.mark.parametrize(
    "fault",
    [
        "decode_killed",
        "prefill_killed",
        "ucx_peer_killed",
        "scheduler_killed",
        "nats_restarted",
        "rolling_restart",
    ],
)
def test_a_fault_costs_the_clients_nothing(chaos: Chaos, fault: str) -> None:
    # The rolling restart waits for four nodes to come back one after another, each loading
    # its model again: on a host whose cores other work takes, about a minute each.
    budget_s = 600 if fault == "rolling_restart" else 300
    assert_clean(chaos.run(scenarios.FAULTS[fault], budget_s))


def test_the_requests_of_a_killed_gateway_stop_on_the_nodes(chaos: Chaos) -> None:
    seconds = chaos.run(scenarios.gateway_killed)
    # Nodes ask every 2 s whether the gateway still wants its requests; NATS answers at once
    # that nobody serves a killed gateway's subject. The bound is "within seconds", read from
    # heartbeats every 0.5 s, with room for a host whose cores are taken by other work (the
    # quiet figure is in bench/chaos.py's table).
    assert seconds < 15.0
