"""The tiers a KV block can live in, and the names pulls from them are measured under.

A prefill or decode node keeps blocks in its pool (``dram``); a tierd keeps them below it, on
NVMe files (``nvme``) and in S3 (``s3``). A node measures the bandwidth of its pulls per source
and reports it in ``NodeStatus.fetch_bandwidth``: the key of a peer's pool is the peer's id, the
key of a tierd's tier is ``<tierd id>-<tier>``. ``bandwidth_key`` is the one place that spells
that key, for the nodes that measure and the scheduler that reads. Pure: no I/O.
"""

from __future__ import annotations

DRAM, NVME, S3 = "dram", "nvme", "s3"
#: The tiers below a node's pool, fastest first; only a tierd holds blocks in them.
LOWER_TIERS = (NVME, S3)
#: How the ``fetch_bandwidth`` keys of lower tiers end (``str.endswith`` takes the tuple).
LOWER_TIER_SUFFIXES = tuple(f"-{tier}" for tier in LOWER_TIERS)


def bandwidth_key(source: str, tier: str) -> str:
    """The ``fetch_bandwidth`` key of pulls from ``source``'s ``tier``: ``source`` itself for
    ``dram``, ``f"{source}-{tier}"`` for a lower tier. Raises ``ValueError`` on another tier."""
    if tier == DRAM:
        return source
    if tier not in LOWER_TIERS:
        raise ValueError(f"unknown tier {tier!r}")
    return f"{source}-{tier}"


def key_tier(key: str) -> str:
    """The tier a ``fetch_bandwidth`` key was measured from: the lower tier it ends in (as
    ``bandwidth_key`` spells it), else ``dram``."""
    for tier, suffix in zip(LOWER_TIERS, LOWER_TIER_SUFFIXES, strict=True):
        if key.endswith(suffix):
            return tier
    return DRAM
