"""Limits: quotas per tenant with a default, values checked when built; counters per tier."""

from __future__ import annotations

import pytest

from services.tierd.holdings import NVME, S3
from services.tierd.limits import Limits, TierCounters


def test_a_tenants_quota_overrides_the_default() -> None:
    limits = Limits(100, 50, default_quota_bytes=10, quotas={b"big": 1_000, b"free": 0})
    assert limits.quota_for(b"big") == 1_000
    assert limits.quota_for(b"anyone") == 10
    assert limits.quota_for(b"free") == 0  # 0 is no quota, here for this tenant alone
    assert Limits(100, 50).quota_for(b"anyone") == 0


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        (dict(nvme_high_bytes=100, nvme_low_bytes=101), "low watermark"),
        (dict(nvme_high_bytes=-1, nvme_low_bytes=-1), "negative"),
        (dict(nvme_high_bytes=1, nvme_low_bytes=0, s3_capacity_bytes=-5), "negative"),
        (dict(nvme_high_bytes=1, nvme_low_bytes=0, default_quota_bytes=-5), "negative"),
        (dict(nvme_high_bytes=1, nvme_low_bytes=0, quotas={b"t": -1}), "negative"),
        (dict(nvme_high_bytes=1, nvme_low_bytes=0, ttl_s=0), "ttl_s"),
    ],
)
def test_impossible_limits_are_refused(kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Limits(**kwargs)  # type: ignore[arg-type]


def test_counters_start_at_zero_and_are_not_shared() -> None:
    one, two = TierCounters(), TierCounters()
    assert one.written == {NVME: 0, S3: 0} and one.corrupt == {NVME: 0, S3: 0}
    assert one.deleted == {} and one.refused == 0
    one.written[NVME] += 1
    one.deleted["ttl"] = 3
    assert two.written[NVME] == 0 and two.deleted == {}
