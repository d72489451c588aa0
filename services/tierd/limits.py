"""tierd's capacities, lifetimes and quotas, and the counters of what it did."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.tierd.holdings import NVME, S3


@dataclass(frozen=True, slots=True)
class Limits:
    """Capacities and lifetimes. ``quotas`` maps a quota key to its tenant's bytes below DRAM;
    a key not in it gets ``default_quota_bytes``. A quota of 0 is no quota, for the default
    and for one tenant alike (``name=0`` exempts that tenant from a default).

    Invariant: no value is negative, and ``nvme_low_bytes <= nvme_high_bytes`` (a round of
    moves could never bring NVMe under its high watermark otherwise).
    """

    nvme_high_bytes: int
    nvme_low_bytes: int
    s3_capacity_bytes: int = 0  # 0: unbounded
    ttl_s: float = 7 * 86_400.0
    default_quota_bytes: int = 0
    quotas: dict[bytes, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        sizes = (self.nvme_high_bytes, self.nvme_low_bytes, self.s3_capacity_bytes)
        if min(*sizes, self.default_quota_bytes, *self.quotas.values()) < 0:
            raise ValueError("capacities and quotas must not be negative")
        if self.nvme_low_bytes > self.nvme_high_bytes:
            raise ValueError("the NVMe low watermark must not exceed the high one")
        if self.ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, got {self.ttl_s}")

    def quota_for(self, quota_key: bytes) -> int:
        return self.quotas.get(quota_key, self.default_quota_bytes)


@dataclass(slots=True)
class TierCounters:
    """What tierd did, for its metrics."""

    written: dict[str, int] = field(default_factory=lambda: {NVME: 0, S3: 0})
    deleted: dict[str, int] = field(default_factory=dict)  # by reason
    evicted: dict[tuple[str, str], int] = field(default_factory=dict)  # by (tier, reason)
    corrupt: dict[str, int] = field(default_factory=lambda: {NVME: 0, S3: 0})
    refused: int = 0  # offered blocks tierd could not keep (no room, over quota)
