"""Each tenant's share, as the core counts it: sequences and KV tokens held, given back."""

from __future__ import annotations

import pytest

from services.gateway.errors import ApiError
from services.gateway.tenant_limits import TenantCaps, TenantLimits


def test_shares_are_held_per_tenant_and_given_back_once() -> None:
    limits = TenantLimits(TenantCaps(sequences=4, kv_tokens=1000, kv_tokens_of={"big": 5000}))
    limits.admit("r1", "a", 3, 600)
    with pytest.raises(ApiError) as refused:
        limits.admit("r2", "a", 2, 100)
    assert refused.value.status == 429 and refused.value.headers["Retry-After"] == "1"
    with pytest.raises(ApiError) as refused:
        limits.admit("r2", "a", 1, 500)
    assert refused.value.status == 429 and "KV tokens" in refused.value.message
    limits.admit("r3", "b", 4, 1000)  # another tenant is not affected
    limits.admit("r4", "big", 1, 4000)  # its own, larger cap
    limits.release("r1")
    limits.release("r1")  # a second release changes nothing
    assert limits.held("a") == (0, 0)
    assert limits.held("b") == (4, 1000)
    limits.admit("r5", "a", 4, 1000)


def test_what_a_tenant_may_never_hold_is_a_400() -> None:
    limits = TenantLimits(TenantCaps(sequences=2, kv_tokens=0, sequences_of={"solo": 1}))
    with pytest.raises(ApiError) as refused:
        limits.admit("r1", "solo", 2, 10)
    assert (refused.value.status, refused.value.param) == (400, "n")
    limits.admit("r2", "a", 2, 10**9)  # 0 tokens: no token cap
    assert limits.held("solo") == (0, 0)
