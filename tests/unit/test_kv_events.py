"""The KV events' wire format against vLLM's, as vLLM documents it (its KV events subscriber
example spells the structs out): each side's decoder reads what the other side encodes. A
frame names its publisher's role, one of the roles that publish events."""

from __future__ import annotations

import itertools
from typing import Any

import msgspec
import pytest

from shared import subjects
from shared.kv_event_feed import ChainBlock, KvEventFeed, frames, stored_events
from shared.kv_events import (
    MAX_FRAME_BLOCKS,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    KvEventFrame,
    decode_batch,
    encode_batch,
    medium_of,
    tier_of,
)
from shared.memory_bus import MemoryBus
from shared.messages import encode
from tests.kvindex.vllm_format import AllBlocksCleared as VllmCleared
from tests.kvindex.vllm_format import BlockRemoved as VllmRemoved
from tests.kvindex.vllm_format import BlockStored as VllmStored
from tests.kvindex.vllm_format import KVEventBatch as VllmBatch


def h(i: int) -> bytes:
    return i.to_bytes(16, "big")


def test_vllms_decoder_reads_crescents_batch() -> None:
    events: list[Event] = [
        AllBlocksCleared("NVME"),
        BlockStored([h(1), h(2)], h(0), [], 32, None, "NVME"),
        BlockRemoved([h(2)], "NVME"),
    ]
    batch = msgspec.msgpack.Decoder(VllmBatch).decode(encode_batch(events, ts=12.5))
    assert batch.ts == 12.5
    cleared, stored, removed = batch.events
    assert isinstance(cleared, VllmCleared)
    assert stored == VllmStored([h(1), h(2)], h(0), [], 32, None, "NVME")
    assert removed == VllmRemoved([h(2)], "NVME")


def test_crescent_reads_vllms_array_batch_with_integer_hashes() -> None:
    sent = VllmBatch(
        3.0,
        [VllmStored([7, 8], None, list(range(32)), 16, None, "GPU"), VllmCleared()],
        data_parallel_rank=1,
    )
    batch = decode_batch(msgspec.msgpack.encode(sent))
    stored, cleared = batch.events
    assert stored == BlockStored([7, 8], None, list(range(32)), 16, None, "GPU")
    assert cleared == AllBlocksCleared(None)  # vLLM's clears every medium
    assert batch.data_parallel_rank == 1


def test_crescent_reads_vllms_map_batch_and_ignores_fields_it_does_not_use() -> None:
    sent: dict[str, Any] = {
        "ts": 4.0,
        "events": [
            {
                "type": "BlockStored",
                "block_hashes": [b"\x01" * 32],
                "parent_block_hash": None,
                "token_ids": [1, 2],
                "block_size": 2,
                "lora_id": None,
                "medium": "CPU",
                "lora_name": None,
                "extra_keys": None,
                "group_idx": 0,
            },
            {"type": "BlockRemoved", "block_hashes": [5], "medium": "GPU", "group_idx": 0},
        ],
    }
    stored, removed = decode_batch(msgspec.msgpack.encode(sent)).events
    assert stored == BlockStored([b"\x01" * 32], None, [1, 2], 2, None, "CPU")
    assert removed == BlockRemoved([5], "GPU")


def test_an_old_vllm_batch_without_medium_is_read() -> None:
    raw = msgspec.msgpack.encode([1.0, [["BlockStored", [9], None, [1], 1, None]]])
    (stored,) = decode_batch(raw).events
    assert isinstance(stored, BlockStored) and stored.medium is None
    assert tier_of(stored.medium) == "gpu"


@pytest.mark.parametrize(
    "raw",
    [b"", b"\xc1", msgspec.msgpack.encode([1.0, [["Unknown", 1]]]), msgspec.msgpack.encode({})],
)
def test_a_malformed_batch_is_refused(raw: bytes) -> None:
    with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
        decode_batch(raw)


def test_crescents_tiers_round_trip_through_their_medium_names() -> None:
    assert [medium_of(t) for t in ("dram", "nvme", "s3")] == ["DRAM", "NVME", "S3"]
    assert [tier_of(medium_of(t)) for t in ("dram", "nvme", "s3")] == ["dram", "nvme", "s3"]
    assert tier_of("CPU_PINNED") == "cpu_pinned"
    with pytest.raises(ValueError, match="unknown tier"):
        medium_of("tape")


def test_stored_blocks_go_out_as_one_event_per_chain_run() -> None:
    blocks = [
        ChainBlock(h(1), h(0), 32),
        ChainBlock(h(2), h(1), 32),
        ChainBlock(h(7), h(5), 32),  # another chain
        ChainBlock(h(8), h(7), 16),  # another block size
    ]
    events = list(stored_events("dram", blocks))
    assert [(e.block_hashes, e.parent_block_hash, e.block_size) for e in events] == [
        ([h(1), h(2)], h(0), 32),
        ([h(7)], h(5), 32),
        ([h(8)], h(7), 16),
    ]
    assert {e.medium for e in events} == {"DRAM"} and all(e.token_ids == [] for e in events)


def test_long_runs_are_cut_so_every_frame_stays_within_its_block_cap() -> None:
    count = 3 * MAX_FRAME_BLOCKS
    blocks = [ChainBlock(h(i + 1), h(i), 32) for i in range(count)]
    events: list[Event] = [AllBlocksCleared("DRAM"), *stored_events("dram", blocks)]
    batches = list(frames(events))
    sizes = [sum(len(e.block_hashes) for e in b if isinstance(e, BlockStored)) for b in batches]
    assert sum(sizes) == count and max(sizes) <= MAX_FRAME_BLOCKS and len(batches) > 3
    chained = [e for b in batches for e in b if isinstance(e, BlockStored)]
    # Each piece of the cut chain names the last block of the piece before as its parent.
    for before, after in itertools.pairwise(chained):
        assert after.parent_block_hash == before.block_hashes[-1]
    assert batches[0][0] == AllBlocksCleared("DRAM")


@pytest.mark.parametrize("role", ["prefill", "decode", "tierd", "external", "gateway", "kvindex"])
def test_a_frame_names_one_of_the_roles_that_publish_events(role: str) -> None:
    frame = KvEventFrame(role=role, publisher="p-0", epoch="e", seq=0, batch=b"")
    data = encode(frame)
    if role in subjects.KV_EVENT_ROLES:
        assert msgspec.json.decode(data, type=KvEventFrame).role == role
    else:
        with pytest.raises(msgspec.ValidationError, match="role"):
            msgspec.json.decode(data, type=KvEventFrame)


@pytest.mark.parametrize("role", ["gateway", "scheduler", "kvindex", "external.x"])
def test_a_role_that_publishes_no_kv_events_gets_no_feed(role: str) -> None:
    with pytest.raises(ValueError, match="publishes no KV events"):
        KvEventFeed(MemoryBus(), role, "x-0")
