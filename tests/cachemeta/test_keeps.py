"""The keep ledger: a tenant's keeps within its quota, extended and never shortened, dropped,
listed by version, ended on their time, and durable across a restart (both backends)."""

from __future__ import annotations

import math

import pytest

from services.cachemeta.keeps import KeepLedger
from services.cachemeta.metrics import CacheMetaMetrics
from shared.rpc.client import CacheMetaError
from shared.rpc.types import KeepGrant
from tests.cachemeta.conftest import Served

ALICE, BOB = b"a" * 16, b"b" * 16


def hs(*ids: int) -> list[bytes]:
    return [i.to_bytes(16, "big") for i in ids]


def test_a_keep_within_the_quota_is_granted_and_one_beyond_it_changes_nothing() -> None:
    ledger = KeepLedger(version=1)
    plan = ledger.plan(ALICE, hs(1, 2, 3), until=100.0, max_blocks=4, now=0.0)
    assert (plan.granted, plan.num_kept, plan.new) == (True, 3, hs(1, 2, 3))
    ledger.apply(plan.rows)
    assert ledger.version == 2
    # Blocks kept already cost nothing again; two new ones would make five.
    refused = ledger.plan(ALICE, hs(2, 3, 4, 5), until=100.0, max_blocks=4, now=1.0)
    assert (refused.granted, refused.num_kept, refused.rows) == (False, 3, [])
    # Another tenant's quota is its own.
    assert ledger.plan(BOB, hs(7, 8), until=100.0, max_blocks=2, now=1.0).granted


def test_a_keep_takes_the_later_time_a_pin_stays_and_ended_keeps_free_the_quota() -> None:
    ledger = KeepLedger(version=1)
    ledger.apply(ledger.plan(ALICE, hs(1, 2), until=100.0, max_blocks=9, now=0.0).rows)
    ledger.apply(ledger.plan(ALICE, hs(1), until=50.0, max_blocks=9, now=0.0).rows)
    ledger.apply(ledger.plan(ALICE, hs(2), until=math.inf, max_blocks=9, now=0.0).rows)
    ledger.apply(ledger.plan(ALICE, hs(2), until=70.0, max_blocks=9, now=0.0).rows)
    assert ledger.listing(now=10.0) == {hs(1)[0]: 100.0, hs(2)[0]: math.inf}
    assert ledger.listing(now=100.0) == {hs(2)[0]: math.inf}
    assert ledger.expired(now=100.0) == hs(1)
    assert ledger.num_kept(ALICE, now=100.0) == 1
    plan = ledger.plan(ALICE, hs(1, 3), until=200.0, max_blocks=3, now=100.0)
    assert (plan.granted, plan.new) == (True, hs(1, 3))  # an ended keep is a new one


def test_a_tenant_cannot_keep_or_drop_another_tenants_hash() -> None:
    ledger = KeepLedger(version=1)
    ledger.apply(ledger.plan(ALICE, hs(1), until=math.inf, max_blocks=1, now=0.0).rows)
    plan = ledger.plan(BOB, hs(1), until=math.inf, max_blocks=1, now=0.0)
    assert plan.rows == [] and plan.new == []
    assert ledger.owned(BOB, hs(1)) == [] and ledger.owned(ALICE, hs(1)) == hs(1)


def test_keeps_over_grpc_and_across_a_restart(served: Served) -> None:
    client, service = served.client, served.service
    assert client is not None and service is not None and service.keeps is not None

    async def scenario() -> None:
        grant = await client.keep_blocks(ALICE, hs(1, 2, 3), ttl_s=600, max_blocks=4)
        assert grant == KeepGrant(True, 3, hs(1, 2, 3))
        over = await client.keep_blocks(ALICE, hs(4, 5), pin=True, max_blocks=4)
        assert over == KeepGrant(False, 3, [])
        assert await client.keep_blocks(ALICE, hs(4), pin=True, max_blocks=4) == KeepGrant(
            True, 4, hs(4)
        )
        listing = await client.list_keeps()
        assert listing.changed and set(listing.keeps) == set(hs(1, 2, 3, 4))
        assert listing.keeps[hs(4)[0]] == math.inf and listing.keeps[hs(1)[0]] > 600
        same = await client.list_keeps(listing.version)
        assert not same.changed and same.keeps == {} and same.version == listing.version
        # A drop (no time, no pin) releases this tenant's keeps and frees its quota.
        assert await client.keep_blocks(ALICE, hs(3, 4), max_blocks=4) == KeepGrant(True, 2)
        after = await client.list_keeps(listing.version)
        assert after.changed and set(after.keeps) == set(hs(1, 2))

    served.call(scenario())
    gauges = {m.name: m.samples[0].value for m in CacheMetaMetrics(service).collect() if m.samples}
    assert gauges["crescent_cachemeta_kept_blocks"] == 2
    served.restart()
    listing = served.call(served.client.list_keeps())  # type: ignore[union-attr]
    assert set(listing.keeps) == set(hs(1, 2))


def test_ended_keeps_are_purged_from_the_database(served: Served) -> None:
    client, service = served.client, served.service
    assert client is not None and service is not None and service.keeps is not None
    keeps = service.keeps
    served.call(client.keep_blocks(ALICE, hs(1, 2), ttl_s=600, max_blocks=4))
    served.call(client.keep_blocks(ALICE, hs(3), pin=True, max_blocks=4))
    keeps.clock = lambda: 10**12  # long after the keeps of 600 s ended
    assert served.call(keeps.purge()) == 2
    assert [r.block_hash for r in served.call(keeps.repository.load_keeps())] == hs(3)


@pytest.mark.parametrize(
    ("quota_key", "ttl_s", "hashes"),
    [(b"", 10.0, hs(1)), (ALICE, -1.0, hs(1)), (ALICE, float("nan"), hs(1)), (ALICE, 1.0, [b"x"])],
)
def test_bad_keeps_are_refused(
    served: Served, quota_key: bytes, ttl_s: float, hashes: list[bytes]
) -> None:
    client = served.client
    assert client is not None
    with pytest.raises(CacheMetaError):
        served.call(client.keep_blocks(quota_key, hashes, ttl_s=ttl_s, max_blocks=4))
