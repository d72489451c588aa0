"""Every test has one tier, by where it lives."""

from __future__ import annotations

from tests.support.tiers import TESTS, tier_of


def test_each_place_has_its_tier() -> None:
    assert tier_of(TESTS / "unit" / "test_import_rules.py") == "unit"
    assert tier_of(TESTS / "bench" / "test_fairness_bench.py") == "unit"
    assert tier_of(TESTS / "e2e" / "test_global_cache.py") == "e2e"
    assert tier_of(TESTS / "plane" / "test_identity_e2e.py") == "e2e"
    assert tier_of(TESTS / "chaos" / "test_overload.py") == "chaos"
    assert tier_of(TESTS / "engine" / "test_prefill_order.py") == "integration"
