"""Chunks and aborts tagged with a request's stream key: only the key's holders make tags that
verify, for that request only, and any change to what the client would see breaks the tag."""

from __future__ import annotations

import msgspec

from shared.messages import AbortRequest, TokenChunk, TokenLogprob, decode, encode
from shared.stream_auth import (
    abort_is_authentic,
    chunk_is_authentic,
    new_stream_key,
    seal_abort,
    seal_chunk,
)


def chunk() -> TokenChunk:
    return TokenChunk(
        request_id="req-0",
        index=3,
        token_ids=[5, 6],
        logprobs=[TokenLogprob(5, -0.25, [(5, -0.25)]), TokenLogprob(6, -1.5, [])],
        node_id="decode-0",
        epoch="e1",
        cached_by_tier={"dram": 32},
    )


def test_a_sealed_chunk_verifies_after_the_wire_and_only_with_its_key() -> None:
    key = new_stream_key()
    sent = chunk()
    seal_chunk(sent, key)
    received = decode(encode(sent), TokenChunk)
    assert chunk_is_authentic(received, "req-0", key)
    assert not chunk_is_authentic(received, "req-0", new_stream_key())
    assert not chunk_is_authentic(received, "req-1", key)  # moved to another request's subject


def test_every_field_a_client_sees_is_covered() -> None:
    key = new_stream_key()
    changes = {
        "index": 4,
        "token_ids": [5, 7],
        "finish_reason": "stop",
        "error": "boom",
        "error_code": 503,
        "owner": "decode-1",
        "migrate": True,
        "num_cached_tokens": 9,
        "cached_by_tier": {"s3": 32},
        "logprobs": None,
    }
    for name, value in changes.items():
        forged = chunk()
        seal_chunk(forged, key)
        forged = msgspec.structs.replace(forged, **{name: value})
        assert not chunk_is_authentic(forged, "req-0", key), name


def test_an_unsigned_chunk_fails_where_a_key_exists() -> None:
    assert not chunk_is_authentic(chunk(), "req-0", new_stream_key())
    assert chunk_is_authentic(chunk(), "req-0", b"")  # a request without a key: no check


def test_aborts_are_bound_to_the_request_and_the_target_node() -> None:
    key = new_stream_key()
    abort = seal_abort(AbortRequest(request_id="req-0", only_node="decode-0"), key)
    assert abort_is_authentic(decode(encode(abort), AbortRequest), key)
    assert not abort_is_authentic(AbortRequest(request_id="req-0"), key)
    retargeted = msgspec.structs.replace(abort, only_node="decode-1")
    assert not abort_is_authentic(retargeted, key)
    assert not abort_is_authentic(abort, new_stream_key())
