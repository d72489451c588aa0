"""Plain values of the cachemeta API, free of gRPC, so pure cores (the scheduler's policy, the
catalogue index) can use them without importing a framework."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

TIERS = ("dram", "nvme", "s3")


@dataclass(frozen=True, slots=True)
class BlockRecord:
    """One full KV block as the catalogue knows it."""

    block_hash: bytes
    parent_hash: bytes
    token_ids: Sequence[int]
    num_bytes: int
    checksum: int


@dataclass(frozen=True, slots=True)
class PrefixHolder:
    """``node_id`` holds, in ``tier``, the first ``num_blocks`` blocks of a matched chain."""

    node_id: str
    tier: str
    num_blocks: int


@dataclass(frozen=True, slots=True)
class TierCapacity:
    tier: str
    capacity_bytes: int
    used_bytes: int


@dataclass(frozen=True, slots=True)
class NodeInfo:
    node_id: str
    role: str
    epoch: str
    last_seen_unix: float
    tiers: list[TierCapacity] = field(default_factory=list)
    num_replicas: int = 0


@dataclass(frozen=True, slots=True)
class CatalogueStats:
    num_blocks: int
    num_replicas: int
    num_nodes: int
    replica_bytes: int


@dataclass(frozen=True, slots=True)
class KeepGrant:
    """The catalogue's answer to a keep: ``granted`` False when the tenant's quota would be
    exceeded (nothing changed); ``num_kept`` its kept blocks now; ``new_block_hashes`` the
    blocks the call began to keep."""

    granted: bool
    num_kept: int
    new_block_hashes: list[bytes] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class KeepListing:
    """The keeps in force at ``version``: block hash -> the unix time its keep ends
    (``math.inf``: pinned). ``changed`` False: the caller's version is current, and ``keeps``
    is empty."""

    version: int
    changed: bool
    keeps: dict[bytes, float] = field(default_factory=dict)
