"""The node's lease table: three kinds, one credential each, each ended once."""

from __future__ import annotations

import pytest

from shared.node.leases import LeaseKind, LeaseTable


def test_a_lease_serves_its_own_blocks_with_its_token_until_it_ends_once() -> None:
    leases = LeaseTable(lease_ttl_s=5)
    lease = leases.grant(LeaseKind.HANDOFF, 0.0, [4, 5, 6], "r")
    assert len(lease.token) >= 24 and lease.token != "r" and not lease.pinned
    assert leases.blocks_for(lease.token, [5, 4], 1.0) == [5, 4]
    assert leases.blocks_for(lease.token, [7], 1.0) is None
    assert leases.blocks_for("r", [4], 1.0) is None  # the request id is no credential
    assert leases.blocks_for(lease.token, [4], 6.0) is None  # expired
    pin = leases.grant(LeaseKind.PEER_PIN, 0.0, [9])
    sink = leases.grant(LeaseKind.SINK_OFFER, 1.0)
    assert pin.pinned and sink.pinned and len(leases) == 3
    assert leases.count(LeaseKind.PEER_PIN) == 1 and leases.count(LeaseKind.HANDOFF) == 1
    assert leases.release_all("r") == [lease] and leases.release(lease.token) is None
    assert leases.expire(4.0) == [] and leases.expire(5.5) == [pin] and leases.expire(7.0) == [sink]
    assert len(leases) == 0


def test_only_a_handoff_lease_names_a_request() -> None:
    leases = LeaseTable(lease_ttl_s=5)
    with pytest.raises(ValueError):
        leases.grant(LeaseKind.HANDOFF, 0.0, [1])
    with pytest.raises(ValueError):
        leases.grant(LeaseKind.PEER_PIN, 0.0, [1], "r")
