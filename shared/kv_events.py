"""KV events: which blocks a publisher of catalogue changes stored or dropped, in vLLM's layout.

Every publisher of catalogue changes (a node for its DRAM pool, a tierd for its NVMe and S3
tiers) also sends them, numbered, on ``subjects.kv_events(<its role>, <its id>)``. A NATS
message there is a ``KvEventFrame``: the publisher's role and id (both what the subject says),
its epoch, a sequence number, and ``batch``, the bytes of one ``KVEventBatch`` encoded as vLLM
encodes it (vllm/distributed/kv_events.py: msgpack,
every struct ``array_like``, events tagged by class name). So vLLM's own decoder structure
reads ``batch``, and a relay forwards vLLM's ZMQ payload frame as ``batch`` unchanged, its
sequence frame as ``seq``.

Fields (vLLM's names, in vLLM's order):

- ``KVEventBatch``: ``ts`` (unix seconds), ``events``, ``data_parallel_rank`` (None here).
- ``BlockStored``: ``block_hashes`` (a chain, each the parent of the next),
  ``parent_block_hash`` (of the first; Crescent's first blocks have the scope's root hash),
  ``token_ids`` (empty from Crescent: the catalogue keeps no users' text), ``block_size``
  (tokens per block, so a block count is a token count), ``lora_id`` (None), ``medium``.
- ``BlockRemoved``: ``block_hashes``, ``medium``.
- ``AllBlocksCleared``: vLLM's has no field; Crescent's appends ``medium`` (None: every
  tier), which vLLM's decoder ignores, as msgspec ignores trailing items of an array.

``medium`` names a tier: Crescent writes ``DRAM`` (a node's pool, the blocks its engine
computes from: vLLM's ``GPU``), ``NVME`` (tierd's files: a disk tier) and ``S3`` (tierd's
bucket). An event without a medium comes from a vLLM that predates the field: its GPU pool.
Hashes are Crescent's 16-byte blake2b chain hashes or, from vLLM, integers or bytes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Annotated

import msgspec
from msgspec import Meta

from shared import subjects
from shared.kv.tiers import DRAM, NVME, S3
from shared.messages import Id, WireMessage

#: Most blocks one frame carries (its batch stays far below NATS's 1 MiB payload cap).
MAX_FRAME_BLOCKS = 8192
MAX_BATCH_BYTES = 1 << 20
BlockKey = Annotated[bytes, Meta(max_length=64)] | int
Keys = Annotated[list[BlockKey], Meta(max_length=1 << 16)]
Medium = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_\-]{1,32}$")]
#: Crescent's tier names on the wire, and back.
MEDIUMS = {DRAM: "DRAM", NVME: "NVME", S3: "S3"}
#: What an event that names no medium came from (vLLM before ``medium``: its GPU pool).
DEFAULT_MEDIUM = "GPU"
KvRole = Annotated[str, Meta(pattern=f"^({'|'.join(subjects.KV_EVENT_ROLES)})$")]


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """One change of a publisher's blocks; the tag is the class name, as vLLM's."""


class BlockStored(KVCacheEvent):
    block_hashes: Keys
    parent_block_hash: BlockKey | None
    token_ids: Annotated[list[int], Meta(max_length=1 << 22)]
    block_size: Annotated[int, Meta(ge=1, le=1 << 20)]
    lora_id: int | None = None
    medium: Medium | None = None  # absent from vLLM's first releases


class BlockRemoved(KVCacheEvent):
    block_hashes: Keys
    medium: Medium | None = None


class AllBlocksCleared(KVCacheEvent):
    medium: Medium | None = None


Event = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: Annotated[list[Event], Meta(max_length=1 << 16)]
    data_parallel_rank: int | None = None


class KvEventFrame(WireMessage, kw_only=True):
    """One numbered batch of the events of ``publisher``, a ``role``. ``seq`` counts frames
    from 0 within one ``epoch`` (a publisher's run); a listener that sees a number skipped has
    missed events."""

    role: KvRole
    publisher: Id
    epoch: Id
    seq: Annotated[int, Meta(ge=0, le=(1 << 63) - 1)]
    batch: Annotated[bytes, Meta(max_length=MAX_BATCH_BYTES)]


class KvResyncRequest(WireMessage, kw_only=True):
    """listener -> publisher: I lost your stream; send every tier cleared, then whole."""

    role: KvRole
    publisher: Id
    reason: Annotated[str, Meta(max_length=256)] = ""


# vLLM releases after the array layout encode the same structs as maps, tagged in ``type``;
# a relayed batch of theirs is read through these twins.
class _MapEvent(msgspec.Struct, gc=False, tag=True):
    pass


class _MapStored(_MapEvent, tag="BlockStored"):
    block_hashes: Keys
    parent_block_hash: BlockKey | None = None
    token_ids: Annotated[list[int], Meta(max_length=1 << 22)] = []
    block_size: Annotated[int, Meta(ge=1, le=1 << 20)] = 1
    medium: Medium | None = None


class _MapRemoved(_MapEvent, tag="BlockRemoved"):
    block_hashes: Keys
    medium: Medium | None = None


class _MapCleared(_MapEvent, tag="AllBlocksCleared"):
    medium: Medium | None = None


class _MapBatch(msgspec.Struct, gc=False):
    ts: float
    events: Annotated[list[_MapStored | _MapRemoved | _MapCleared], Meta(max_length=1 << 16)]
    data_parallel_rank: int | None = None


_encoder = msgspec.msgpack.Encoder()
_array_decoder = msgspec.msgpack.Decoder(KVEventBatch)
_map_decoder = msgspec.msgpack.Decoder(_MapBatch)


def encode_batch(events: Sequence[Event], ts: float | None = None) -> bytes:
    """The msgpack bytes of a batch of ``events`` stamped ``ts`` (default: now)."""
    return _encoder.encode(KVEventBatch(time.time() if ts is None else ts, list(events)))


def decode_batch(data: bytes) -> KVEventBatch:
    """A batch in either of vLLM's layouts (array, as Crescent writes, or map); raises
    ``msgspec.DecodeError`` or ``msgspec.ValidationError`` when it is neither."""
    if _is_map(data):
        return _from_map(_map_decoder.decode(data))
    return _array_decoder.decode(data)


def _is_map(data: bytes) -> bool:
    # msgpack's map markers: fixmap 0x80-0x8f, map 16 and map 32.
    return bool(data) and (data[0] & 0xF0 == 0x80 or data[0] in (0xDE, 0xDF))


def _from_map(batch: _MapBatch) -> KVEventBatch:
    events: list[Event] = []
    for e in batch.events:
        if isinstance(e, _MapStored):
            stored = (e.block_hashes, e.parent_block_hash, e.token_ids, e.block_size, None)
            events.append(BlockStored(*stored, e.medium))
        elif isinstance(e, _MapRemoved):
            events.append(BlockRemoved(e.block_hashes, e.medium))
        else:
            events.append(AllBlocksCleared(e.medium))
    return KVEventBatch(batch.ts, events, batch.data_parallel_rank)


def medium_of(tier: str) -> str:
    """The wire name of Crescent's ``tier``; ``ValueError`` for another."""
    try:
        return MEDIUMS[tier]
    except KeyError:
        raise ValueError(f"unknown tier {tier!r}") from None


def tier_of(medium: str | None) -> str:
    """The tier a listener files an event's blocks under: the medium in lower case, so
    Crescent's come back as its own tier names (``dram``, ``nvme``, ``s3``) and another
    publisher's keep theirs (``gpu``, ``cpu``, ``disk``)."""
    return (medium or DEFAULT_MEDIUM).lower()
