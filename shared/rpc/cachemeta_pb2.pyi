# ruff: noqa
# fmt: off
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Block(_message.Message):
    __slots__ = ("block_hash", "parent_hash", "token_ids", "num_bytes", "checksum")
    BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    PARENT_HASH_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    block_hash: bytes
    parent_hash: bytes
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    num_bytes: int
    checksum: int
    def __init__(self, block_hash: _Optional[bytes] = ..., parent_hash: _Optional[bytes] = ..., token_ids: _Optional[_Iterable[int]] = ..., num_bytes: _Optional[int] = ..., checksum: _Optional[int] = ...) -> None: ...

class RegisterBlocksRequest(_message.Message):
    __slots__ = ("node_id", "tier", "blocks", "replace")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    tier: str
    blocks: _containers.RepeatedCompositeFieldContainer[Block]
    replace: bool
    def __init__(self, node_id: _Optional[str] = ..., tier: _Optional[str] = ..., blocks: _Optional[_Iterable[_Union[Block, _Mapping]]] = ..., replace: _Optional[bool] = ...) -> None: ...

class RegisterBlocksReply(_message.Message):
    __slots__ = ("num_registered",)
    NUM_REGISTERED_FIELD_NUMBER: _ClassVar[int]
    num_registered: int
    def __init__(self, num_registered: _Optional[int] = ...) -> None: ...

class DropBlocksRequest(_message.Message):
    __slots__ = ("node_id", "tier", "block_hashes")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    tier: str
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, node_id: _Optional[str] = ..., tier: _Optional[str] = ..., block_hashes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class DropBlocksReply(_message.Message):
    __slots__ = ("num_dropped",)
    NUM_DROPPED_FIELD_NUMBER: _ClassVar[int]
    num_dropped: int
    def __init__(self, num_dropped: _Optional[int] = ...) -> None: ...

class MatchPrefixRequest(_message.Message):
    __slots__ = ("block_hashes", "tiers")
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    tiers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, block_hashes: _Optional[_Iterable[bytes]] = ..., tiers: _Optional[_Iterable[str]] = ...) -> None: ...

class PrefixHolder(_message.Message):
    __slots__ = ("node_id", "tier", "num_blocks")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    tier: str
    num_blocks: int
    def __init__(self, node_id: _Optional[str] = ..., tier: _Optional[str] = ..., num_blocks: _Optional[int] = ...) -> None: ...

class MatchPrefixReply(_message.Message):
    __slots__ = ("holders",)
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    holders: _containers.RepeatedCompositeFieldContainer[PrefixHolder]
    def __init__(self, holders: _Optional[_Iterable[_Union[PrefixHolder, _Mapping]]] = ...) -> None: ...

class TouchBlocksRequest(_message.Message):
    __slots__ = ("block_hashes",)
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, block_hashes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class TouchBlocksReply(_message.Message):
    __slots__ = ("num_touched",)
    NUM_TOUCHED_FIELD_NUMBER: _ClassVar[int]
    num_touched: int
    def __init__(self, num_touched: _Optional[int] = ...) -> None: ...

class TierCapacity(_message.Message):
    __slots__ = ("tier", "capacity_bytes", "used_bytes")
    TIER_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    tier: str
    capacity_bytes: int
    used_bytes: int
    def __init__(self, tier: _Optional[str] = ..., capacity_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id", "role", "epoch", "tiers")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    role: str
    epoch: str
    tiers: _containers.RepeatedCompositeFieldContainer[TierCapacity]
    def __init__(self, node_id: _Optional[str] = ..., role: _Optional[str] = ..., epoch: _Optional[str] = ..., tiers: _Optional[_Iterable[_Union[TierCapacity, _Mapping]]] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("resync",)
    RESYNC_FIELD_NUMBER: _ClassVar[int]
    resync: bool
    def __init__(self, resync: _Optional[bool] = ...) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("node_id", "role", "epoch", "last_seen_unix", "tiers", "num_replicas")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_UNIX_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    NUM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    role: str
    epoch: str
    last_seen_unix: float
    tiers: _containers.RepeatedCompositeFieldContainer[TierCapacity]
    num_replicas: int
    def __init__(self, node_id: _Optional[str] = ..., role: _Optional[str] = ..., epoch: _Optional[str] = ..., last_seen_unix: _Optional[float] = ..., tiers: _Optional[_Iterable[_Union[TierCapacity, _Mapping]]] = ..., num_replicas: _Optional[int] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListNodesReply(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsReply(_message.Message):
    __slots__ = ("num_blocks", "num_replicas", "num_nodes", "replica_bytes")
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    NUM_NODES_FIELD_NUMBER: _ClassVar[int]
    REPLICA_BYTES_FIELD_NUMBER: _ClassVar[int]
    num_blocks: int
    num_replicas: int
    num_nodes: int
    replica_bytes: int
    def __init__(self, num_blocks: _Optional[int] = ..., num_replicas: _Optional[int] = ..., num_nodes: _Optional[int] = ..., replica_bytes: _Optional[int] = ...) -> None: ...

class KeepBlocksRequest(_message.Message):
    __slots__ = ("quota_key", "block_hashes", "ttl_s", "pin", "max_blocks")
    QUOTA_KEY_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    PIN_FIELD_NUMBER: _ClassVar[int]
    MAX_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    quota_key: bytes
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    ttl_s: float
    pin: bool
    max_blocks: int
    def __init__(self, quota_key: _Optional[bytes] = ..., block_hashes: _Optional[_Iterable[bytes]] = ..., ttl_s: _Optional[float] = ..., pin: _Optional[bool] = ..., max_blocks: _Optional[int] = ...) -> None: ...

class KeepBlocksReply(_message.Message):
    __slots__ = ("granted", "num_kept", "new_block_hashes")
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    NUM_KEPT_FIELD_NUMBER: _ClassVar[int]
    NEW_BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    granted: bool
    num_kept: int
    new_block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, granted: _Optional[bool] = ..., num_kept: _Optional[int] = ..., new_block_hashes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class Keep(_message.Message):
    __slots__ = ("block_hash", "until_unix", "pinned")
    BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    UNTIL_UNIX_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    block_hash: bytes
    until_unix: float
    pinned: bool
    def __init__(self, block_hash: _Optional[bytes] = ..., until_unix: _Optional[float] = ..., pinned: _Optional[bool] = ...) -> None: ...

class ListKeepsRequest(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class ListKeepsReply(_message.Message):
    __slots__ = ("version", "changed", "keeps")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    KEEPS_FIELD_NUMBER: _ClassVar[int]
    version: int
    changed: bool
    keeps: _containers.RepeatedCompositeFieldContainer[Keep]
    def __init__(self, version: _Optional[int] = ..., changed: _Optional[bool] = ..., keeps: _Optional[_Iterable[_Union[Keep, _Mapping]]] = ...) -> None: ...
