"""The relay's numbering of another engine's batches: vLLM's 8-byte sequence frame becomes
``seq``, its payload travels unchanged under the external role, and a restart of the engine
starts a new epoch."""

from __future__ import annotations

import msgspec
import pytest

from services.kvindex.relay import RelayStream
from shared.kv_events import decode_batch
from tests.kvindex.vllm_format import BlockStored, KVEventBatch


def seq(n: int) -> bytes:
    return n.to_bytes(8, "big")


def test_the_engines_numbers_and_payload_are_relayed_as_they_are() -> None:
    stream = RelayStream("vllm-a")
    payload = msgspec.msgpack.encode(
        KVEventBatch(1.0, [BlockStored([5], None, [1], 1, None, "GPU")])
    )
    first, second = stream.frame(seq(7), payload), stream.frame(seq(8), payload)
    assert (first.seq, second.seq) == (7, 8) and first.epoch == second.epoch
    assert first.publisher == "vllm-a" and first.batch == payload
    # Another engine's events go out under the external role, never a Crescent one.
    assert first.role == "external" and stream.subject == "crescent.kv.events.external.vllm-a"
    assert decode_batch(first.batch).events[0].block_hashes == [5]  # type: ignore[union-attr]


def test_a_restarted_engine_gets_a_new_epoch() -> None:
    stream = RelayStream("vllm-a")
    before = stream.frame(seq(41), b"x").epoch
    after = stream.frame(seq(0), b"x")
    assert after.seq == 0 and after.epoch != before


@pytest.mark.parametrize(
    ("frame", "message"), [(b"\x00" * 4, "8 bytes"), (b"\xff" * 8, "negative")]
)
def test_a_bad_sequence_frame_is_refused(frame: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RelayStream("vllm-a").frame(frame, b"x")


def test_a_publisher_id_that_cannot_be_a_subject_token_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot be used in a NATS subject"):
        RelayStream("vllm.a")
